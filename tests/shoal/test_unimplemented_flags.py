"""Every tritonserver flag is known to `shoal serve`: implemented, accepted with no effect (and
said so), or refused by name with the reason; never argparse's "unrecognized arguments".
--log-file and --model-load-retry-count work."""

from __future__ import annotations

import os

import pytest

from shoal import unimplemented_flags
from shoal.cli import parse_serve
from tests.serving import wait_until
from tests.shoal.serving import one_model_repository, serve

# tritonserver's flags, from its src/command_line_parser.cc (docs/serving.md lists Shoal's answer to each)
TRITONSERVER_FLAGS = """
allow-client-shm allow-cpu-metrics allow-gpu-metrics allow-grpc allow-http allow-metrics allow-sagemaker
allow-vertex-ai backend-config backend-directory buffer-manager-thread-count cache-config cache-directory
cuda-memory-pool-byte-size cuda-virtual-address-size disable-auto-complete-config enable-peer-access
exit-on-error exit-timeout-secs grpc-address grpc-header-forward-pattern grpc-http2-max-ping-strikes
grpc-http2-max-pings-without-data grpc-http2-min-recv-ping-interval-without-data grpc-infer-allocation-pool-size
grpc-infer-response-compression-level grpc-infer-thread-count grpc-keepalive-permit-without-calls
grpc-keepalive-time grpc-keepalive-timeout grpc-max-connection-age grpc-max-connection-age-grace
grpc-max-response-pool-size grpc-port grpc-restricted-protocol grpc-root-cert grpc-server-cert grpc-server-key
grpc-use-ssl grpc-use-ssl-mutual help host-policy http-address http-header-forward-pattern http-max-input-size
http-port http-restricted-api http-thread-count id load-model log-error log-file log-format log-info
log-verbose log-warning metrics-address metrics-config metrics-interval-ms metrics-port
min-supported-compute-capability model-config-name model-control-mode model-load-gpu-limit
model-load-retry-count model-load-thread-count model-namespacing model-repository model-store
pinned-memory-pool-byte-size rate-limit rate-limit-resource repoagent-directory repository-poll-secs
response-cache-byte-size reuse-grpc-port reuse-http-port sagemaker-port sagemaker-safe-port-range
sagemaker-thread-count strict-model-config strict-readiness trace-config trace-count trace-file trace-level
trace-log-frequency trace-rate vertex-ai-default-model vertex-ai-port vertex-ai-thread-count
""".split()


def test_every_tritonserver_flag_is_known(capsys):
    from shoal.cli import serve_parser

    known = {option for action in serve_parser()._actions for option in action.option_strings}
    unknown = [f for f in TRITONSERVER_FLAGS if f"--{f}" not in known and f"--{f}" not in unimplemented_flags.REFUSED]
    assert unknown == []


def test_a_refused_flag_says_why(monkeypatch):
    """None is refused today (issue 48 accepted the last ones); the way stays for a flag that would be."""
    monkeypatch.setitem(unimplemented_flags.REFUSED, "--some-flag", "because")
    with pytest.raises(SystemExit) as stopped:
        parse_serve(["--some-flag=x"])
    assert str(stopped.value) == "shoal serve: --some-flag is not supported: because"


def test_flags_with_no_effect_are_accepted_and_said():
    args = parse_serve(
        [
            "--grpc-infer-thread-count=4",
            "--pinned-memory-pool-byte-size",
            "0",
            "--allow-sagemaker=false",
            "--enable-peer-access",
        ]
    )
    assert args.flag_warnings[0].startswith("--grpc-infer-thread-count=4 has no effect in Shoal: the gRPC endpoint")
    assert any(w.startswith("--pinned-memory-pool-byte-size=0 has no effect") for w in args.flag_warnings)
    assert any(w.startswith("--enable-peer-access has no effect") for w in args.flag_warnings)


def test_backend_config_errors_are_tritonservers():
    with pytest.raises(SystemExit, match="No backend specified. --backend-config option format is"):
        parse_serve(["--backend-config=,x=1"])
    with pytest.raises(
        SystemExit, match="--backend-config option format is '<backend name>,<setting>=<value>'. Got python,x"
    ):
        parse_serve(["--backend-config=python,x"])
    assert parse_serve(["--backend-config=default-max-batch-size=8"]).backend_config == ["default-max-batch-size=8"]


def test_log_file_takes_every_services_log(tmp_path):
    repository = one_model_repository(tmp_path / "models", "q")
    log_file = tmp_path / "triton.log"
    with serve(repository, tmp_path / "cache", f"--log-file={log_file}", "--http-thread-count=8") as running:
        wait_until(
            lambda: "Started HTTPService" in (log_file.read_text() if log_file.exists() else ""),
            120,
            "the HTTP service in the log file",
            0.2,
            detail=running.output,
        )
    text = log_file.read_text()
    assert " worker shoal.worker: loaded 'q' version 1" in text  # a child service's line, in the same file
    assert "--http-thread-count=8 has no effect in Shoal" in text
    assert "Started HTTPService" not in running.output()


def test_model_load_retry_count_retries_a_failing_load(tmp_path):
    repository = one_model_repository(tmp_path / "models", "q")
    (repository / "q" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    log_file = tmp_path / "triton.log"
    with serve(repository, tmp_path / "cache", f"--log-file={log_file}", "--model-load-retry-count=2"):
        wait_until(
            lambda: log_file.exists() and "UNAVAILABLE" in log_file.read_text(), 120, "UNAVAILABLE in the log", 0.2
        )
        text = log_file.read_text()
    assert text.count("failed to load 'q' version 1") == 3, text
    assert "retrying the load of 'q' version 1 (2 of 2)" in text
    assert os.path.getsize(log_file) > 0

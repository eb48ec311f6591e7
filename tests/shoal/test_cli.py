"""The `shoal` command: tritonserver flag compatibility, and `shoal serve` end to end."""

from __future__ import annotations

import argparse
import glob
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from shared.process import settings as s
from shared.process.natsserver import free_port, wait_for_port
from shoal.cli import parse_serve
from tests.serving import wait_until


def test_tritonserver_flag_forms():
    args = parse_serve(
        [
            "--model-repository=/models",
            "--http-port",
            "9000",
            "--strict-readiness=false",
            "--log-verbose=1",
            "--exit-timeout-secs=5",
            "--allow-grpc=false",
            "--model-store=/m2",
        ][:-1]
    )
    assert args.model_repository == ["/models"] and args.http_port == 9000
    assert args.strict_readiness is False and args.log_verbose == 1 and args.exit_timeout_secs == 5
    assert parse_serve(["--strict-readiness=ON"]).strict_readiness is True
    assert parse_serve(["--model-store=/m"]).model_repository == ["/m"]
    args = parse_serve(["--model-control-mode=EXPLICIT", "--load-model=simple", "--load-model", "mlp"])
    assert args.model_control_mode == "explicit" and args.load_model == ["simple", "mlp"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--grpc-restricted-protocol=inference"], "expects <protocols>:<key>=<value>"),
        (["--grpc-restricted-protocol=nope:k=v"], "unknown restricted protocol 'nope'"),
        (["--grpc-use-ssl=true"], "needs --grpc-server-cert and --grpc-server-key"),
        (["--cache-config", "redis,host=x"], "--cache-config redis: 'port' is required"),
        (["--cache-config", "local,size=10", "--response-cache-byte-size=5"], "can not be used together"),
        (["--trace-config", "mode=zipkin"], 'Available options are "triton" and "opentelemetry"'),
        (
            ["--trace-config", "mode=opentelemetry", "--trace-config", "opentelemetry,bsp_max_queue_size=lots"],
            "Invalid option value. Got lots",
        ),
        (["--trace-config", ",rate=1"], "No trace mode specified"),
        (["--load-model=simple"], "only allowed with --model-control-mode=explicit"),
        (["--model-control-mode=explicit", "--load-model=*", "--load-model=a"], "must be the only"),
    ],
)
def test_unsupported_flags_are_refused(argv, message):
    with pytest.raises(SystemExit) as err:
        parse_serve(argv)
    assert message in str(err.value)


def test_trace_flags():
    args = parse_serve(
        [
            "--trace-config",
            "triton,file=/tmp/t.json",
            "--trace-config",
            "level=TIMESTAMPS",
            "--trace-config=rate=1",
            "--trace-count=5",
        ]
    )
    assert args.trace == {
        "file": "/tmp/t.json",
        "level": "TIMESTAMPS",
        "rate": 1,
        "count": 5,
        "log-frequency": 0,
        "config": [],  # triton mode: the other services get no trace settings
    }


def test_opentelemetry_trace_flags(monkeypatch):
    """tritonserver's OpenTelemetry settings, with the batch span processor's defaults from the
    environment; every service gets them (each exports its own spans)."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
    args = parse_serve(
        [
            "--trace-config=mode=opentelemetry",
            "--trace-config=opentelemetry,url=localhost:4318/v1/traces",
            "--trace-config=opentelemetry,resource=service.name=mine",
            "--trace-config=opentelemetry,bsp_max_queue_size=64",
            "--trace-config=level=TENSORS",
            "--trace-config=rate=0",
        ]
    )
    assert args.trace["level"] == "TENSORS" and args.trace["rate"] == 0
    assert args.trace["config"] == [
        "mode=opentelemetry",
        "opentelemetry,url=localhost:4318/v1/traces",
        "opentelemetry,resource=service.name=mine",
        "opentelemetry,bsp_max_queue_size=64",
        "opentelemetry,bsp_schedule_delay=200",
        "opentelemetry,bsp_max_export_batch_size=512",
    ]


def test_exit_on_error_stops_serve_when_a_model_fails(tmp_path):
    from services.repository import examples

    examples.write_model(tmp_path, "good", examples.simple_graph(), examples.SIMPLE_CONFIG.replace("simple", "good"))
    examples.write_model(tmp_path, "bad", examples.simple_graph(), 'name: "bad"\nmax_batch_sze: 1\n')
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "shoal.cli",
            "serve",
            f"--model-repository={tmp_path}",
            "--exit-on-error=true",
            f"--http-port={free_port()}",
            f"--grpc-port={free_port()}",
            f"--metrics-port={free_port()}",
            "--http-address=127.0.0.1",
            "--log-info=false",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "c")},
    )
    assert out.returncode == 1
    assert "--exit-on-error=true" in out.stderr


def test_unknown_flag_is_an_error(capsys):
    with pytest.raises(SystemExit):
        parse_serve(["--no-such-flag=1"])
    assert "unrecognized arguments" in capsys.readouterr().err


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def test_shoal_serve_end_to_end(tmp_path):
    """`shoal serve` with no repository: example models, a table, requests, clean stop."""
    http_port, metrics_port, grpc_port = free_port(), free_port(), free_port()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    log = (tmp_path / "serve.log").open("w+")
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shoal.cli",
            "serve",
            f"--http-port={http_port}",
            f"--grpc-port={grpc_port}",
            f"--metrics-port={metrics_port}",
            "--http-address=127.0.0.1",
            "--workers=2",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:

        def table() -> bool:
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()
            return "| Model" in (tmp_path / "serve.log").read_text()

        wait_until(table, 120, "the model table")
        table = (tmp_path / "serve.log").read_text()
        for line in ("| mlp ", "| simple ", "| identity_fp32 "):
            assert line in table
        assert "READY" in table
        wait_for_port(http_port, 10)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        assert client.is_server_ready()
        tensor = httpclient.InferInput("INPUT0", [4, 256], "FP32")
        tensor.set_data_from_numpy(np.ones((4, 256), np.float32))
        assert client.infer("mlp", [tensor]).as_numpy("OUTPUT0").shape == (4, 16)
        big = httpclient.InferInput("INPUT0", [1, 200_000], "FP32")
        big.set_data_from_numpy(np.ones((1, 200_000), np.float32))
        client.infer("identity_fp32", [big])
        client.close()
        wait_for_port(grpc_port, 10)  # gRPC is on by default, as in Triton
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as grpc_client:
            assert grpc_client.is_server_ready()
        children = children_of(serve.pid)
        assert len(children) == 5  # nats-server, repository, 2 workers, gateway (the scheduler is in it)
    finally:
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(60)
        log.close()
    assert code == 0
    assert all(
        not os.path.exists(f"/proc/{pid}") or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
        for pid in children
    ), "orphan processes"
    assert not [p for p in glob.glob("/dev/shm/shoal_*") if os.path.getmtime(p) > serve_started(tmp_path)]


def serve_started(tmp_path) -> float:
    return os.path.getmtime(tmp_path / "cache")


def test_schedulers_and_gateways_flags_build_replicas(tmp_path):
    from shoal.supervisor import build_cluster

    cluster = build_cluster(parse_serve(["--schedulers", "3", "--gateways", "2"]), "nats://127.0.0.1:4222", tmp_path)
    ids = [cluster.scheduler.scheduler_id] + [s.scheduler_id for s in cluster.more_schedulers]
    assert len(ids) == 3 and len(set(ids)) == 3  # replicas: each its own id on the bus
    assert len(cluster.more_gateways) == 1 and cluster.more_gateways[0].gateway_id != cluster.gateway.gateway_id
    assert cluster.gateway.cohost_scheduler and cluster.more_gateways[0].cohost_scheduler
    assert build_cluster(parse_serve([]), "nats://127.0.0.1:4222", tmp_path).more_schedulers == []


def test_the_first_gateway_alone_serves_the_openai_port(tmp_path):
    from shoal.supervisor import build_cluster

    args = parse_serve(["--openai-port", "9000", "--gateways", "2"])
    cluster = build_cluster(args, "nats://127.0.0.1:4222", tmp_path)
    assert (cluster.gateway.openai_port, cluster.more_gateways[0].openai_port) == (9000, 0)
    assert build_cluster(parse_serve([]), "nats://127.0.0.1:4222", tmp_path).gateway.openai_port == 0


def test_the_openai_api_key_reaches_the_gateways_by_their_environment_only(tmp_path):
    from shoal import openai_key
    from shoal.supervisor import build_cluster

    args = parse_serve(["--openai-port", "9000", "--openai-api-key", "sk-not-on-argv"])
    cluster = build_cluster(args, "nats://127.0.0.1:4222", tmp_path)
    assert cluster.env == {"SHOAL_GATEWAY_OPENAI_API_KEY": "sk-not-on-argv"}
    assert "sk-not-on-argv" not in " ".join(s.to_argv(cluster.gateway))  # `ps` shows argv to every user
    assert openai_key.problem(args) is None
    assert build_cluster(parse_serve([]), "nats://127.0.0.1:4222", tmp_path).env == {}
    missing = parse_serve(["--openai-port", "9000", "--openai-api-key-file", str(tmp_path / "none")])
    assert "cannot read --openai-api-key-file" in (openai_key.problem(missing) or "")


def test_the_gateways_cohost_the_schedulers_unless_told_not_to(tmp_path):
    from shoal.supervisor import build_cluster

    url = "nats://127.0.0.1:4222"
    default = build_cluster(parse_serve(["--rate-limit", "execution_count"]), url, tmp_path)
    assert default.scheduler is None and default.more_schedulers == []  # no scheduler process
    assert default.gateway.cohost_scheduler and default.gateway.rate_limit == "execution_count"
    standalone = build_cluster(parse_serve(["--cohost-scheduler", "false"]), url, tmp_path)
    assert not standalone.gateway.cohost_scheduler and standalone.scheduler is not None
    assert standalone.more_schedulers == []
    with pytest.raises(SystemExit, match="--schedulers must be at least 1 with --cohost-scheduler=false"):
        parse_serve(["--cohost-scheduler", "false", "--schedulers", "0"])
    with pytest.raises(SystemExit, match="--schedulers must not be negative"):
        parse_serve(["--schedulers", "-1"])


def test_several_model_repositories_reach_the_repository_service(tmp_path):
    from shoal.supervisor import build_cluster

    args = parse_serve(["--model-repository", "/a", "--model-store=/b", "--model-namespacing=false"])
    assert args.model_repository == ["/a", "/b"]
    cluster = build_cluster(args, "nats://127.0.0.1:4222", [tmp_path / "a", "s3://bucket/models"])
    assert cluster.repository.model_repository == [str(tmp_path / "a"), "s3://bucket/models"]
    assert not cluster.repository.model_namespacing
    # the service's own flags (`shoal repository`), as the supervisor passes them
    argv = s.to_argv(cluster.repository)
    parser = argparse.ArgumentParser()
    s.add_arguments(parser, s.RepositorySettings)
    again = s.from_namespace(s.RepositorySettings, parser.parse_args(argv))
    assert again.model_repository == cluster.repository.model_repository


def test_model_namespacing_reaches_the_repository_service(tmp_path):
    from shoal.supervisor import build_cluster

    cluster = build_cluster(parse_serve(["--model-namespacing"]), "nats://127.0.0.1:4222", tmp_path)
    assert cluster.repository.model_namespacing

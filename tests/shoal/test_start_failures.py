"""What tritonserver accepts at start starts; what fails at start ends `shoal serve` at once
with the reason, and stops cleanly (issue 28 item 14)."""

from __future__ import annotations

import urllib.request

import numpy as np
import tritonclient.http as httpclient

from shared.process.natsserver import free_port
from tests.serving import wait_until
from tests.shoal.serving import one_model_repository, serve

# Triton's qa/L0_metrics passes this value (its second pair reads as 0.1:0.0) and expects a server
TRITON_QA_QUANTILES = "0.1:0.0.1,0.7:0.01,0.75:0.01"
SUMMARY_FAMILIES = [
    f"nv_inference_{kind}_summary_us"
    for kind in ("request", "queue", "compute_input", "compute_infer", "compute_output")
]


def test_tritons_custom_quantiles_start_and_label_the_summaries(tmp_path):
    repository = one_model_repository(tmp_path / "models", "q")
    metrics_port = free_port()
    flags = (
        f"--metrics-port={metrics_port}",
        "--metrics-config=summary_latencies=true",
        f"--metrics-config=summary_quantiles={TRITON_QA_QUANTILES}",
    )
    with serve(repository, tmp_path / "cache", *flags) as running:
        running.wait_for("Started Metrics Service")

        def metrics() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
                return response.read().decode()

        def quantiles(text: str, family: str) -> dict[str, str]:
            prefix = f'{family}{{model="q",version="1",quantile="'
            return dict(line[len(prefix) :].split('"} ') for line in text.splitlines() if line.startswith(prefix))

        # qa/L0_metrics test_summaries_custom_quantiles reads /metrics before any request (issue 38
        # item 1): each family carries exactly the quantiles asked for, NaN until observed (prometheus-cpp)
        wait_until(lambda: "nv_inference_request_summary_us_count" in metrics(), 30, "the request summary")
        text = metrics()
        for family in SUMMARY_FAMILIES:
            assert quantiles(text, family) == {"0.1": "NaN", "0.7": "NaN", "0.75": "NaN"}, (family, text)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}")
        tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
        client.infer("q", [tensor])
        wait_until(lambda: 'nv_inference_request_summary_us_count{model="q",version="1"} 1' in metrics(), 30, "one")
        observed = quantiles(metrics(), "nv_inference_request_summary_us")
        assert sorted(observed) == ["0.1", "0.7", "0.75"] and all(float(v) > 0 for v in observed.values()), observed


def test_a_service_that_cannot_start_ends_the_serve_at_once(tmp_path):
    repository = one_model_repository(tmp_path / "models", "q")
    # 192.0.2.1 (TEST-NET-1) is no local address: the gateway's metrics listener cannot bind it
    flags = ("--metrics-address=192.0.2.1", "--ready-timeout-secs=600", "--exit-timeout-secs=60")
    with serve(repository, tmp_path / "cache", *flags) as running:
        code = running.process.wait(120)  # far below both timeouts: the start ends, not the wait
        out = running.output()
    assert code == 1, out
    assert "gateway exited with code 1 while starting" in out
    assert "cannot assign requested address" in out  # the reason, from the gateway
    assert "did not stop within the exit timeout" not in out
    assert "restarting" not in out

"""Discovery over NATS micro, `shoal status`, the logging extension, exact metrics."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from shoal.topology import collect
from tests.cluster import running_cluster
from tests.integration.test_endpoints import http


def test_every_service_answers_srv_info(shoal):
    services = asyncio.run(collect(shoal.nats.url))
    kinds = sorted(s["name"] for s in services)
    assert kinds == ["shoal-gateway", "shoal-repository", "shoal-scheduler", "shoal-worker"]
    for service in services:
        assert service["metadata"]["host"] and service["metadata"]["pid"]
        assert "error" not in service["status"]
    worker = next(s for s in services if s["name"] == "shoal-worker")
    assert worker["status"]["models"]["simple/1"]["instances"] == 1


def test_connections_are_named(shoal):
    url = f"http://127.0.0.1:{shoal.nats.monitor_port}/connz?limit=100"
    with urllib.request.urlopen(url, timeout=5) as response:
        names = {c.get("name", "") for c in json.loads(response.read())["connections"]}
    # a co-hosted scheduler (the default) uses its gateway's connection
    standalone = ("shoal-scheduler-",) if shoal.cluster.scheduler is not None else ()
    for prefix in ("shoal-gateway-", *standalone, "shoal-worker-", "shoal-repository"):
        assert any(n.startswith(prefix) for n in names), (prefix, names)


def test_shoal_status_command(shoal):
    out = subprocess.run(
        [sys.executable, "-m", "shoal.cli", "status", "--nats-url", shoal.nats.url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    for kind in ("gateway", "scheduler", "worker", "repository"):
        assert f"\n{kind} " in "\n" + out.stdout, out.stdout
    assert "simple/1" in out.stdout


def test_logging_extension(client, shoal):
    settings = client.get_log_settings()
    assert settings == {
        "log_file": "",
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "default",
    }
    updated = client.update_log_settings({"log_verbose_level": 1, "log_format": "ISO8601", "log_info": None})
    assert updated["log_verbose_level"] == 1 and updated["log_format"] == "ISO8601" and updated["log_info"] is True
    assert client.get_log_settings() == updated
    with pytest.raises(InferenceServerException) as err:
        client.update_log_settings({"log_file": "/tmp/x"})
    assert err.value.status() == "501"
    status, _, raw = http(shoal.url, "/v2/logging", "POST", b'{"log_format": "fancy"}')
    assert status == 503 and "invalid argument for --log_format" in json.loads(raw)["error"]
    client.update_log_settings({"log_verbose_level": 0, "log_format": "default"})


def metric(url: str, name: str, model: str) -> float:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == name:  # the parser names counter samples `<name>_total`
            return sum(s.value for s in family.samples if s.labels.get("model") == model)
    return 0.0


def test_metrics_and_stats_count_known_traffic_exactly(client, shoal):
    names = ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count")
    before = {n: metric(shoal.metrics_url, n, "nobatch") for n in names}
    stats_before = client.get_inference_statistics("nobatch")["model_stats"][0]
    tensor = httpclient.InferInput("INPUT0", [2, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((2, 3), np.float32))
    for _ in range(5):
        client.infer("nobatch", [tensor])
    after = {n: metric(shoal.metrics_url, n, "nobatch") for n in names}
    assert {n: after[n] - before[n] for n in names} == {n: 5 for n in names}
    stats = client.get_inference_statistics("nobatch")["model_stats"][0]
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert stats["inference_stats"][key]["count"] == stats_before["inference_stats"][key]["count"] + 5, key
        assert stats["inference_stats"][key]["ns"] > stats_before["inference_stats"][key]["ns"], key
    assert stats["inference_count"] == stats_before["inference_count"] + 5
    assert stats["execution_count"] == stats_before["execution_count"] + 5


@pytest.fixture(scope="module")
def traced(test_repository, tmp_path_factory):
    trace_file = tmp_path_factory.mktemp("trace") / "trace.json"
    with running_cluster(test_repository, trace_file=str(trace_file), trace_level="TIMESTAMPS", trace_rate=1) as r:
        yield r, trace_file


def test_trace_file_spans_gateway_scheduler_and_worker(traced):
    running, trace_file = traced
    client = httpclient.InferenceServerClient(running.url)
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    client.infer("batch_probe", [tensor], request_id="traced-1")
    records = json.loads(trace_file.read_text())
    info = next(r for r in records if r.get("request_id") == "traced-1")
    assert info["model_name"] == "batch_probe" and info["model_version"] == 1
    assert info["batch_reason"] == "queue delay expired" and info["batch_size"] == 1
    stamps = next(r for r in records if r["id"] == info["id"] and "timestamps" in r)["timestamps"]
    names = [t["name"] for t in stamps]
    assert names == [
        "REQUEST_START",
        "QUEUE_START",
        "COMPUTE_START",
        "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START",
        "COMPUTE_END",
        "REQUEST_END",
    ]
    ns = [t["ns"] for t in stamps]
    assert ns == sorted(ns)
    queue_wait = ns[2] - ns[1]
    assert queue_wait >= 2_000_000_000 * 0.9  # batch_probe waits out its 2 s queue delay for a lone request
    client.close()


def test_trace_level_tensors_writes_the_tensors(traced):
    """Level TENSORS (Triton mode): the inputs as queued and the outputs as the backend gave them,
    in Triton's entries (src/tracer.cc, `TraceTensorActivity`)."""
    running, trace_file = traced
    client = httpclient.InferenceServerClient(running.url)
    client.update_trace_settings("identity_int32", {"trace_level": ["TIMESTAMPS", "TENSORS"]})
    try:
        tensor = httpclient.InferInput("INPUT0", [1, 3], "INT32")
        tensor.set_data_from_numpy(np.array([[1, -2, 3]], np.int32))
        client.infer("identity_int32", [tensor], request_id="tensors-1")
    finally:
        client.update_trace_settings("identity_int32", {"trace_level": None})
    records = json.loads(trace_file.read_text())
    trace_id = next(r for r in records if r.get("request_id") == "tensors-1")["id"]
    entries = [r for r in records if r["id"] == trace_id and "activity" in r]
    assert entries == [
        {
            "id": trace_id,
            "activity": "TENSOR_QUEUE_INPUT",
            "tensor": {"name": "INPUT0", "data": "1,-2,3", "shape": "1,3", "dtype": "INT32"},
        },
        {
            "id": trace_id,
            "activity": "TENSOR_BACKEND_OUTPUT",
            "tensor": {"name": "OUTPUT0", "data": "1,-2,3", "shape": "1,3", "dtype": "INT32"},
        },
    ]
    client.close()


def test_trace_settings_api(traced, shoal):
    running, _ = traced
    client = httpclient.InferenceServerClient(running.url)
    settings = client.get_trace_settings()
    assert settings["trace_level"] == ["TIMESTAMPS"] and settings["trace_rate"] == "1"
    assert settings["trace_mode"] == "triton" and settings["trace_file"].endswith("trace.json")
    model = client.update_trace_settings("simple", {"trace_rate": "5", "trace_level": ["OFF"]})
    assert model["trace_rate"] == "5" and model["trace_level"] == ["OFF"]
    assert client.get_trace_settings()["trace_rate"] == "1"  # the global setting is untouched
    cleared = client.update_trace_settings("simple", {"trace_rate": None, "trace_level": None})
    assert cleared["trace_rate"] == "1" and cleared["trace_level"] == ["TIMESTAMPS"]
    for body, code in (
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, "400"),
        ({"trace_file": "/x"}, "501"),
        ({"trace_count": "-2"}, "400"),
    ):
        with pytest.raises(InferenceServerException) as err:
            client.update_trace_settings(settings=body)
        assert err.value.status() == code, body
    with pytest.raises(InferenceServerException) as err:
        client.get_trace_settings("no_such_model")
    assert err.value.status() == "400" and "Request for unknown model : no_such_model" in err.value.message()
    client.close()


@pytest.fixture(scope="module")
def detailed_metrics(test_repository):
    with running_cluster(test_repository, summary_latencies=True, histogram_latencies=True) as running:
        yield running


def test_summaries_histograms_and_shoal_metrics(detailed_metrics):
    client = httpclient.InferenceServerClient(detailed_metrics.url)
    tensor = httpclient.InferInput("INPUT0", [2, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((2, 3), np.float32))
    for _ in range(6):
        client.infer("nobatch", [tensor])
    client.close()
    with urllib.request.urlopen(detailed_metrics.metrics_url, timeout=10) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    summary = [s for s in families["nv_inference_request_summary_us"].samples if s.labels.get("model") == "nobatch"]
    quantiles = {s.labels["quantile"] for s in summary if "quantile" in s.labels}
    assert quantiles == {"0.5", "0.9", "0.95", "0.99", "0.999"}
    assert next(s for s in summary if s.name.endswith("_count")).value == 6
    histogram = [
        s for s in families["nv_inference_first_response_histogram_ms"].samples if s.labels.get("model") == "nobatch"
    ]
    assert {s.labels.get("le") for s in histogram if s.name.endswith("_bucket")} == {
        "100",
        "500",
        "2000",
        "5000",
        "+Inf",
    }
    assert next(s for s in histogram if s.labels.get("le") == "+Inf").value == 6
    batches = [s for s in families["shoal_batch_size"].samples if s.labels.get("model") == "nobatch"]
    assert next(s for s in batches if s.name.endswith("_count")).value == 6
    assert 0.0 <= families["nv_cpu_utilization"].samples[0].value <= 1.0
    assert families["nv_cpu_memory_total_bytes"].samples[0].value > 0
    assert "shoal_shm_bytes_in_use" in families and "shoal_worker_compute_seconds" in families

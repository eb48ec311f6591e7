"""Ensembles (`platform: "ensemble"`) run as a dataflow in the scheduler, through real services."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.cluster import running_cluster
from tests.integration import ensemble_models
from tests.serving import wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, shape):
    root = ensemble_models.build(tmp_path_factory.mktemp("ensembles"))
    with running_cluster(root, allow_client_shm=True, shape=shape) as running:
        yield running


@pytest.fixture(scope="module")
def explicit(tmp_path_factory):
    root = ensemble_models.build(tmp_path_factory.mktemp("explicit_ensembles"), bad=False)
    with running_cluster(root, repository={"model_control_mode": "explicit"}, request_timeout_s=3) as running:
        yield running


def fp32(name: str, value: np.ndarray) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(value.shape), "FP32")
    tensor.set_data_from_numpy(value)
    return tensor


def index(running) -> dict[str, dict]:
    request = urllib.request.Request(f"http://{running.url}/v2/repository/index", data=b"", method="POST")
    with urllib.request.urlopen(request) as response:
        return {e["name"]: e for e in json.loads(response.read())}


def test_pipeline_branches_run_in_parallel(cluster):
    client = httpclient.InferenceServerClient(cluster.url)
    assert client.is_model_ready("pipeline")
    assert client.get_model_metadata("pipeline")["platform"] == "ensemble"
    raw = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = client.infer("pipeline", [fp32("RAW", raw)], request_id="abc")
    np.testing.assert_array_equal(result.as_numpy("SCORES"), (raw * 2).sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(result.as_numpy("MASK"), raw * 6)
    assert result.get_response()["id"] == "abc"
    # every step sleeps `delay_ms` (the parameter reaches each member): two in series plus two
    # in parallel take 2 delays, not 3
    delay = 400
    started = time.monotonic()
    result = client.infer("pipeline", [fp32("RAW", raw)], parameters={"delay_ms": delay})
    elapsed = time.monotonic() - started
    np.testing.assert_array_equal(result.as_numpy("MASK"), raw * 6)
    assert 2 * delay / 1000 <= elapsed < 2.8 * delay / 1000, elapsed
    client.close()


def test_only_requested_outputs_run(cluster):
    client = httpclient.InferenceServerClient(cluster.url)
    before = client.get_inference_statistics("segment")["model_stats"][0]["inference_stats"]["success"]["count"]
    raw = np.ones((1, 4), np.float32)
    result = client.infer("pipeline", [fp32("RAW", raw)], outputs=[httpclient.InferRequestedOutput("SCORES")])
    np.testing.assert_array_equal(result.as_numpy("SCORES"), [[8.0]])
    assert result.as_numpy("MASK") is None
    after = client.get_inference_statistics("segment")["model_stats"][0]["inference_stats"]["success"]["count"]
    assert after == before  # the segment step fed nothing requested: pruned
    client.close()


def test_nested_ensemble_with_onnx_step(cluster):
    client = httpclient.InferenceServerClient(cluster.url)
    x = np.array([[1, 2, 3]], np.float32)
    result = client.infer("nested", [fp32("IN", x)])
    np.testing.assert_array_equal(result.as_numpy("OUT"), x * 6)
    np.testing.assert_array_equal(result.as_numpy("SCORE"), [[12.0]])
    client.close()


def test_batch_dimension_between_batching_and_non_batching_steps(cluster):
    client = httpclient.InferenceServerClient(cluster.url)
    x = np.array([[1, 2, 3]], np.float32)
    result = client.infer("mixed", [fp32("RAW", x)])
    assert result.get_output("OUT")["shape"] == [1, 3]
    np.testing.assert_array_equal(result.as_numpy("OUT"), x * 6)
    client.close()


def test_bytes_between_steps(cluster):
    client = httpclient.InferenceServerClient(cluster.url)
    text = np.array([[b"hello", b"ensemble"]], dtype=object)
    tensor = httpclient.InferInput("TEXT", [1, 2], "BYTES")
    tensor.set_data_from_numpy(text)
    result = client.infer("text", [tensor])
    assert result.as_numpy("OUT").tolist() == [[b"OLLEH", b"ELBMESNE"]]
    client.close()


def test_large_intermediates_go_through_shared_memory_and_are_freed(cluster):
    client = httpclient.InferenceServerClient(cluster.url)
    client.infer("pipeline", [fp32("RAW", np.ones((1, 4), np.float32))])  # warm
    baseline = cluster.segments()
    raw = np.random.default_rng(0).random((2, 50_000), dtype=np.float32)  # 400 KB: out of line at every step
    for _ in range(3):
        result = client.infer("pipeline", [fp32("RAW", raw)])
        np.testing.assert_allclose(result.as_numpy("MASK"), raw * 6, rtol=1e-6)
        np.testing.assert_allclose(result.as_numpy("SCORES"), (raw * 2).sum(axis=1, keepdims=True), rtol=1e-4)
    wait_until(lambda: cluster.segments() == baseline, what="the intermediates freed")
    client.close()


def test_failing_step_fails_the_request_with_its_status(cluster):
    client = httpclient.InferenceServerClient(cluster.url)
    ok = client.infer("failing", [fp32("RAW", np.ones((1, 70_000), np.float32))])  # large: shm segments
    np.testing.assert_array_equal(ok.as_numpy("OUT"), np.full((1, 70_000), 2, np.float32))
    baseline = cluster.segments()
    with pytest.raises(InferenceServerException) as err:
        client.infer("failing", [fp32("RAW", -np.ones((1, 70_000), np.float32))])
    assert err.value.status() == "400"
    assert err.value.message() == "in ensemble 'failing', negative input"
    wait_until(lambda: cluster.segments() == baseline, what="the preprocess output freed")
    ok = client.infer("failing", [fp32("RAW", np.ones((1, 3), np.float32))])  # still serving
    np.testing.assert_array_equal(ok.as_numpy("OUT"), [[2, 2, 2]])
    stats = client.get_inference_statistics("failing")["model_stats"][0]["inference_stats"]
    # Triton counts a failed ensemble request twice (its error answer, then its statistics: issue 28 item 12)
    assert stats["fail"]["count"] == 2 and stats["success"]["count"] == 2
    client.close()


def test_bad_graphs_are_unavailable_with_the_reason(cluster):
    entries = index(cluster)
    assert entries["bad_unknown"]["state"] == "UNAVAILABLE"
    assert (
        entries["bad_unknown"]["reason"]
        == "ensemble 'bad_unknown' depends on 'no_such_model' which has no loaded version"
    )
    assert entries["bad_unwritten"]["state"] == "UNAVAILABLE"
    assert entries["bad_unwritten"]["reason"] == (
        "output 'OTHER' for ensemble 'bad_unwritten' is not written: at least one of its depending tensors, "
        "'missing', is not connected"
    )
    assert entries["bad_cycle"]["state"] == "UNAVAILABLE"
    assert entries["bad_cycle"]["reason"] == "ensemble tensor 'a' is unused in ensemble 'bad_cycle'"
    assert entries["bad_dtype"]["state"] == "UNAVAILABLE"
    assert entries["bad_dtype"]["reason"] == (
        "in ensemble bad_dtype, ensemble tensor pre: inconsistent data type: TYPE_FP32 is inferred from model "
        "preprocess while TYPE_STRING is inferred from model upper"
    )
    client = httpclient.InferenceServerClient(cluster.url)
    assert not client.is_model_ready("bad_unknown")
    client.close()


def test_concurrent_requests_batch_in_members(cluster):
    client = httpclient.InferenceServerClient(cluster.url, concurrency=8)
    raws = [np.full((1, 4), i, np.float32) for i in range(16)]

    def preprocess() -> tuple[int, int]:
        stats = client.get_inference_statistics("preprocess")["model_stats"][0]
        return stats["inference_count"], stats["execution_count"]

    before = preprocess()
    # 8 in flight (gevent); each step sleeps 50 ms, so the requests behind the first one queue up
    pending = [client.async_infer("pipeline", [fp32("RAW", r)], parameters={"delay_ms": 50}) for r in raws]
    results = [p.get_result() for p in pending]
    for raw, result in zip(raws, results):
        np.testing.assert_array_equal(result.as_numpy("MASK"), raw * 6)
    after = preprocess()
    assert after[0] - before[0] == 16
    assert after[1] - before[1] < 16  # the preprocess step batched requests of different ensemble requests
    client.close()


def test_statistics_and_metrics_show_the_ensemble(cluster):
    client = httpclient.InferenceServerClient(cluster.url)
    client.infer("pipeline", [fp32("RAW", np.ones((1, 4), np.float32))])
    stats = client.get_inference_statistics("pipeline")["model_stats"][0]
    assert stats["name"] == "pipeline" and stats["inference_stats"]["success"]["count"] >= 1
    assert set(stats["ensemble_steps"]) == {"preprocess", "classify", "segment"}
    # Triton's accounting: one execution per successful request, compute times summed over the steps
    assert stats["execution_count"] == stats["inference_stats"]["success"]["count"]
    assert stats["inference_stats"]["compute_infer"]["ns"] > 0
    assert stats["batch_stats"][0]["batch_size"] >= 1
    assert stats["ensemble_steps"]["preprocess"]["success"]["count"] >= 1
    with urllib.request.urlopen(cluster.metrics_url) as response:
        metrics = response.read().decode()
    assert 'nv_inference_request_success{model="pipeline",version="1"}' in metrics
    client.close()


def test_client_shared_memory_inputs_and_outputs(cluster):
    client = httpclient.InferenceServerClient(cluster.url)
    raw = np.arange(8, dtype=np.float32).reshape(2, 4)
    handles = []
    try:
        for name, size in (("ens_in", raw.nbytes), ("ens_out", 8 + raw.nbytes)):
            key = f"/ens_test_{name}_{time.monotonic_ns()}"
            handles.append(shm.create_shared_memory_region(key.lstrip("/"), key, size))
            client.register_system_shared_memory(name, key, size)
        shm.set_shared_memory_region(handles[0], [raw])
        tensor = httpclient.InferInput("RAW", [2, 4], "FP32")
        tensor.set_shared_memory("ens_in", raw.nbytes)
        outputs = [httpclient.InferRequestedOutput("SCORES"), httpclient.InferRequestedOutput("MASK")]
        outputs[0].set_shared_memory("ens_out", 8)
        outputs[1].set_shared_memory("ens_out", raw.nbytes, offset=8)
        result = client.infer("pipeline", [tensor], outputs=outputs)
        assert [o["name"] for o in result.get_response()["outputs"]] == ["SCORES", "MASK"]
        assert all("data" not in o for o in result.get_response()["outputs"])
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(handles[1], np.float32, [2, 1]), (raw * 2).sum(axis=1, keepdims=True)
        )
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handles[1], np.float32, [2, 4], offset=8), raw * 6)
    finally:
        client.unregister_system_shared_memory()
        for handle in handles:
            shm.destroy_shared_memory_region(handle)
        client.close()


def test_explicit_load_pulls_in_members_and_readiness_follows_them(explicit):
    client = httpclient.InferenceServerClient(explicit.url, network_timeout=120)
    assert not client.is_model_ready("preprocess")
    client.load_model("nested")  # an ensemble of an ensemble: everything below it loads
    for name in ("nested", "pipeline", "preprocess", "classify", "segment", "identity"):
        assert client.is_model_ready(name), name
    x = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(client.infer("nested", [fp32("IN", x)]).as_numpy("OUT"), x * 6)
    client.unload_model("segment")
    assert not client.is_model_ready("pipeline") and not client.is_model_ready("nested")
    entries = index(explicit)
    assert entries["pipeline"]["reason"] == "ensemble 'pipeline' depends on 'segment' which has no loaded version"
    with pytest.raises(InferenceServerException) as err:
        client.infer("pipeline", [fp32("RAW", x)])
    assert err.value.status() in ("400", "404", "503")
    client.load_model("segment")
    assert client.is_model_ready("pipeline") and client.is_model_ready("nested")
    np.testing.assert_array_equal(client.infer("nested", [fp32("IN", x)]).as_numpy("OUT"), x * 6)
    client.unload_model("nested", unload_dependents=True)
    assert not client.is_model_ready("nested")
    assert not client.is_model_ready("identity")  # only nested used it
    client.close()


def test_a_step_past_the_deadline_does_not_hang(explicit):
    client = httpclient.InferenceServerClient(explicit.url, network_timeout=60)
    client.load_model("pipeline")
    x = np.ones((1, 4), np.float32)
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as err:
        client.infer("pipeline", [fp32("RAW", x)], parameters={"delay_ms": 4000})  # the gateway waits 3 s
    assert err.value.status() == "503" and time.monotonic() - started < 6
    result = client.infer("pipeline", [fp32("RAW", x)])  # queued behind the sleeping step, then served
    np.testing.assert_array_equal(result.as_numpy("MASK"), x * 6)
    client.close()


def canceled(running, model: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(running.metrics_url, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "nv_inference_request_failure":
            return sum(
                s.value for s in family.samples if s.labels["model"] == model and s.labels["reason"] == "CANCELED"
            )
    return 0.0


def test_client_disconnect_cancels_the_ensemble_and_frees_its_tensors(cluster):
    client = httpclient.InferenceServerClient(cluster.url)
    client.infer("pipeline", [fp32("RAW", np.ones((1, 4), np.float32))])
    baseline, before = cluster.segments(), canceled(cluster, "pipeline")
    data = ",".join(["1.5"] * 70_000)  # out of line at the gateway and at every step
    body = (
        '{"inputs":[{"name":"RAW","shape":[1,70000],"datatype":"FP32","data":[%s]}],'
        '"parameters":{"delay_ms":800}}' % data
    ).encode()
    host, port = cluster.url.split(":")
    raw = socket.create_connection((host, int(port)))
    raw.sendall(
        b"POST /v2/models/pipeline/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    wait_until(lambda: cluster.segments() > baseline)  # the gateway sent it on
    raw.close()  # the client goes away while the first step runs
    wait_until(lambda: canceled(cluster, "pipeline") == before + 1)
    wait_until(lambda: cluster.segments() == baseline)  # the step that finished late had its output freed
    result = client.infer("pipeline", [fp32("RAW", np.ones((1, 4), np.float32))])
    np.testing.assert_array_equal(result.as_numpy("MASK"), np.full((1, 4), 6, np.float32))
    client.close()


def test_intermediates_over_the_bus_when_there_is_no_shared_memory(tmp_path):
    """Workers on other hosts: a large intermediate stays with the worker that made it and the
    next step fetches it in chunks; the ensemble frees it with a release message."""
    root = ensemble_models.build(tmp_path, bad=False)
    with running_cluster(root, transport="bus") as running:
        client = httpclient.InferenceServerClient(running.url)
        raw = np.random.default_rng(1).random((1, 40_000), dtype=np.float32)
        baseline = running.segments()
        result = client.infer("pipeline", [fp32("RAW", raw)])
        np.testing.assert_allclose(result.as_numpy("MASK"), raw * 6, rtol=1e-6)
        assert running.segments() == baseline  # no shared memory on this transport
        client.close()


def test_ensembles_across_scheduler_replicas(tmp_path):
    """The ensemble and its members may be served by different scheduler replicas."""
    root = ensemble_models.build(tmp_path, bad=False)
    with running_cluster(root, schedulers=2) as running:
        client = httpclient.InferenceServerClient(running.url)
        x = np.array([[1, 2, 3]], np.float32)
        for _ in range(5):
            result = client.infer("nested", [fp32("IN", x)])
            np.testing.assert_array_equal(result.as_numpy("OUT"), x * 6)
        assert client.get_inference_statistics("nested")["model_stats"][0]["inference_stats"]["success"]["count"] == 5
        client.close()

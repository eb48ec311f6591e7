"""Model control modes, load/unload, reload without downtime, warmup, agents, readiness."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from services.repository import examples
from tests.cluster import identity_config, running_cluster
from tests.integration.test_endpoints import http
from tests.serving import wait_until

WARMUP = """
model_warmup [
  { name: "zeros" batch_size: 2 count: 3 inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } },
  { name: "random" batch_size: 1 inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } } },
  { name: "file" batch_size: 1 inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "in.bin" } } }
]
"""


def identity(root: Path, name: str, extra: str = "", instances: int = 1) -> Path:
    config = identity_config(name, "FP32", 8, extra).replace("count: 1", f"count: {instances}")
    return examples.write_model(root, name, examples.identity_graph(TensorProto.FLOAT, 2, name), config)


def infer_identity(client: httpclient.InferenceServerClient, model: str, width: int = 4) -> np.ndarray:
    value = np.arange(width, dtype=np.float32).reshape(1, width)
    tensor = httpclient.InferInput("INPUT0", [1, width], "FP32")
    tensor.set_data_from_numpy(value)
    result = client.infer(model, [tensor]).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(result, value)
    return result


@pytest.fixture(scope="module")
def explicit_repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("explicit")
    identity(root, "first")
    identity(root, "second")
    model_dir = identity(root, "warm", WARMUP)
    (model_dir / "warmup").mkdir()
    (model_dir / "warmup" / "in.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    bad = identity(root, "bad_warmup", WARMUP)  # no warmup/in.bin: warmup fails, model never READY
    assert not (bad / "warmup").exists()
    agent = 'model_repository_agents { agents [ { name: "checksum" parameters { key: "MD5:1/model.onnx" value: "%s" } } ] }\n'
    ok = identity(root, "checksum_ok")
    onnx_md5 = hashlib.md5((ok / "1" / "model.onnx").read_bytes()).hexdigest()
    identity(root, "checksum_ok", agent % onnx_md5)
    identity(root, "checksum_bad", agent % ("0" * 32))
    return root


@pytest.fixture(scope="module")
def explicit(explicit_repo):
    with running_cluster(explicit_repo, repository={"model_control_mode": "explicit", "load_model": ["first"]}) as r:
        yield r


@pytest.fixture
def eclient(explicit):
    client = httpclient.InferenceServerClient(explicit.url, network_timeout=120)
    yield client
    client.close()


def index_of(client) -> dict[str, dict]:
    return {e["name"]: e for e in client.get_model_repository_index()}


def test_explicit_mode_loads_only_what_was_asked(eclient):
    index = index_of(eclient)
    assert index["first"]["state"] == "READY"
    assert index["second"] == {"name": "second"}  # on disk, never loaded
    assert eclient.is_server_ready()  # strict readiness counts only models asked for
    assert not eclient.is_model_ready("second")


def test_load_infer_unload(eclient):
    eclient.load_model("second")
    assert eclient.is_model_ready("second")
    infer_identity(eclient, "second")
    eclient.unload_model("second")
    assert not eclient.is_model_ready("second")
    assert index_of(eclient)["second"] == {
        "name": "second",
        "version": "1",
        "state": "UNAVAILABLE",
        "reason": "unloaded",
    }
    with pytest.raises(InferenceServerException) as err:
        infer_identity(eclient, "second")
    assert err.value.status() in ("404", "503")
    eclient.load_model("second")  # and back
    infer_identity(eclient, "second")


def test_load_errors(eclient):
    with pytest.raises(InferenceServerException) as err:
        eclient.load_model("not_there")
    assert err.value.status() == "500"
    assert "failed to load 'not_there', failed to poll from model repository" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        eclient.load_model("first", config="{not json")
    assert err.value.status() == "500"
    assert err.value.message() == "failed to load 'first', failed to poll from model repository"


def test_config_override_reloads_and_plain_load_reverts(eclient):
    config = eclient.get_model_config("first")
    config["max_batch_size"] = 4
    config["instance_group"][0]["count"] = 2
    eclient.load_model("first", config=json.dumps(config))
    new = eclient.get_model_config("first")
    assert new["max_batch_size"] == 4 and new["instance_group"][0]["count"] == 2
    infer_identity(eclient, "first")
    eclient.load_model("first")
    assert eclient.get_model_config("first")["max_batch_size"] == 8


def test_file_override_makes_a_new_model(eclient, explicit_repo):
    onnx_bytes = (explicit_repo / "first" / "1" / "model.onnx").read_bytes()
    config = json.loads(json.dumps(eclient.get_model_config("first")))
    config["name"] = "from_files"
    config["instance_group"][0]["name"] = "from_files"
    eclient.load_model("from_files", config=json.dumps(config), files={"file:1/model.onnx": onnx_bytes})
    infer_identity(eclient, "from_files")
    eclient.unload_model("from_files")


def test_file_override_cannot_escape(explicit, explicit_repo):
    evil = {
        "parameters": {
            "config": json.dumps({"name": "evil", "backend": "onnxruntime"}),
            "file:../../escaped.txt": base64.b64encode(b"x").decode(),
        }
    }
    status, _, raw = http(explicit.url, "/v2/repository/models/evil/load", "POST", json.dumps(evil).encode())
    # a poll failure as any other (issue 28 item 4); the reason, outside the model directory, is logged
    assert (status, json.loads(raw)["error"]) == (500, "failed to load 'evil', failed to poll from model repository")
    assert not list(explicit_repo.parent.rglob("escaped.txt"))
    status, _, raw = http(
        explicit.url, "/v2/repository/models/first/load", "POST", json.dumps({"parameters": {"nonsense": "1"}}).encode()
    )
    assert status == 400 and json.loads(raw)["error"] == "Unrecognized load parameter 'nonsense'."


def test_file_override_name_too_long_is_tritons_500(explicit):
    """A file name longer than the file system takes (255 bytes on Linux): Triton's words, not errno 36."""
    for relative, reason in (
        (
            "1/" + "m" * 300 + ".onnx",
            "failed to open binary file for write 1/" + "m" * 300 + ".onnx: File name too long",
        ),
        (
            "1/" + "d" * 300 + "/model.onnx",
            "Failed to create directory '1/" + "d" * 300 + "', errno:File name too long",
        ),
    ):
        body = {
            "parameters": {
                "config": json.dumps({"name": "long_name", "backend": "onnxruntime"}),
                "file:" + relative: base64.b64encode(b"x").decode(),
            }
        }
        status, _, raw = http(explicit.url, "/v2/repository/models/long_name/load", "POST", json.dumps(body).encode())
        error = json.loads(raw)["error"]
        # issue 28 item 4: Triton's status and text; the reason goes to the repository's log
        assert (status, error) == (500, "failed to load 'long_name', failed to poll from model repository")
        assert reason  # logged by the repository service (services/repository/overrides.py:poll_failed)


def test_warmup_runs_before_ready(eclient):
    eclient.load_model("warm")
    entry = index_of(eclient)["warm"]
    assert entry["state"] == "READY" and entry["warmup_ms"] > 0
    with pytest.raises(InferenceServerException) as err:
        eclient.load_model("bad_warmup")
    assert err.value.status() == "400" and "in.bin" in err.value.message()
    assert not eclient.is_model_ready("bad_warmup")


def test_checksum_agent(eclient):
    eclient.load_model("checksum_ok")
    assert eclient.is_model_ready("checksum_ok")
    with pytest.raises(InferenceServerException) as err:
        eclient.load_model("checksum_bad")
    assert err.value.status() == "400" and "checksum agent: MD5 of '1/model.onnx'" in err.value.message()


def test_reload_under_load_loses_nothing(explicit, eclient):
    failures: list[str] = []
    done = threading.Event()
    count = [0]

    def load() -> None:
        client = httpclient.InferenceServerClient(explicit.url, network_timeout=60)
        while not done.is_set():
            try:
                infer_identity(client, "first")
                count[0] += 1
            except Exception as exc:  # any error during a reload is a failure
                failures.append(repr(exc))
        client.close()

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: count[0] > 20, 60, "traffic", errors=(InferenceServerException,))
    config = eclient.get_model_config("first")
    for instances in (2, 1, 3, 1):
        config["instance_group"][0]["count"] = instances
        eclient.load_model("first", config=json.dumps(config))
    seen = count[0]
    wait_until(lambda: count[0] > seen + 20, 60, "traffic after the reloads", errors=(InferenceServerException,))
    done.set()
    for t in threads:
        t.join(60)
    assert failures == []
    assert count[0] > 40


def test_unload_drains_queued_requests(explicit, eclient, explicit_repo):
    """Requests already accepted finish even though the unload starts while they wait."""
    config = eclient.get_model_config("second") if eclient.is_model_ready("second") else None
    if config is None:
        eclient.load_model("second")
        config = eclient.get_model_config("second")
    config["dynamic_batching"] = {"max_queue_delay_microseconds": 1500000, "preferred_batch_size": [8]}
    eclient.load_model("second", config=json.dumps(config))
    results: list[object] = []

    def one() -> None:
        client = httpclient.InferenceServerClient(explicit.url, network_timeout=60)
        try:
            results.append(infer_identity(client, "second"))
        except Exception as exc:
            results.append(exc)
        client.close()

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    wait_until(
        lambda: pending(eclient, explicit, "second") == 3, 60, "3 queued requests", errors=(InferenceServerException,)
    )
    eclient.unload_model("second")  # waits out the 1.5 s queue delay, the requests complete
    for t in threads:
        t.join(30)
    assert all(isinstance(r, np.ndarray) for r in results), results
    assert not eclient.is_model_ready("second")


def pending(client, running, model: str) -> float:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(running.metrics_url, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "nv_inference_pending_request_count":
            return sum(s.value for s in family.samples if s.labels["model"] == model)
    return 0.0


def test_load_unload_cycles_do_not_grow_memory(explicit, eclient):
    worker = explicit.cluster.child("worker-0").process.pid

    def rss() -> int:
        with open(f"/proc/{worker}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024

    for _ in range(10):  # settle allocator pools first
        eclient.load_model("second")
        eclient.unload_model("second")
    before = rss()
    for _ in range(100):
        eclient.load_model("second")
        eclient.unload_model("second")
    after = rss()
    growth = (after - before) / before
    print(
        f"worker RSS over 100 load/unload cycles: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB ({growth:+.2%})"
    )
    assert growth < 0.05


def test_unload_does_not_wait_on_a_frozen_scheduler(tmp_path):
    """The drain before an unload is asked of the replica holding the model's lease, and asked
    again: a replica that stopped answering (frozen, cut off) is waited on until its lease
    expires (4 s), not for the whole unload timeout (30 s) as when only a live owner answered."""
    identity(tmp_path, "first")
    with running_cluster(
        tmp_path, shape="standalone", repository={"model_control_mode": "explicit", "load_model": ["first"]}
    ) as running:
        client = httpclient.InferenceServerClient(running.url, network_timeout=60)
        infer_identity(client, "first")  # served: the scheduler holds the lease
        scheduler = running.cluster.child("scheduler").process.pid
        os.kill(scheduler, signal.SIGSTOP)
        try:
            started = time.monotonic()
            client.unload_model("first")
            took = time.monotonic() - started
        finally:
            os.kill(scheduler, signal.SIGCONT)
        assert not client.is_model_ready("first")
        assert took < 20, f"the unload waited {took:.1f}s on a scheduler that does not answer"
        client.close()


@pytest.fixture
def poll_repo(tmp_path) -> Path:
    identity(tmp_path, "alpha")
    return tmp_path


def test_poll_mode_follows_the_repository(poll_repo):
    with running_cluster(poll_repo, repository={"model_control_mode": "poll", "repository_poll_secs": 1}) as running:
        client = httpclient.InferenceServerClient(running.url, network_timeout=60)
        infer_identity(client, "alpha")
        with pytest.raises(InferenceServerException) as err:
            client.load_model("alpha")
        assert err.value.status() == "503" and "polling is enabled" in err.value.message()
        identity(poll_repo, "beta")  # a new model appears
        wait_until(lambda: client.is_model_ready("beta"), 60, "beta to load", errors=(InferenceServerException,))
        infer_identity(client, "beta")
        config = (poll_repo / "alpha" / "config.pbtxt").read_text().replace("max_batch_size: 8", "max_batch_size: 2")
        (poll_repo / "alpha" / "config.pbtxt").write_text(config)  # a changed config reloads
        wait_until(
            lambda: client.get_model_config("alpha")["max_batch_size"] == 2,
            60,
            "alpha to reload",
            errors=(InferenceServerException,),
        )
        infer_identity(client, "alpha")
        (poll_repo / "alpha" / "config.pbtxt").write_text("this is not a config {")  # a broken reload keeps the old
        identity(poll_repo, "gamma")  # appears in the same pass, after alpha (passes go in name order)
        wait_until(lambda: client.is_model_ready("gamma"), 60, "gamma to load", errors=(InferenceServerException,))
        assert client.is_model_ready("alpha")
        infer_identity(client, "alpha")
        import shutil

        shutil.rmtree(poll_repo / "beta")  # a removed model unloads, then leaves the index
        # not ready and gone from the index are two steps of the repository (unload, then forget):
        # wait for the last one, never read the index once right after the first
        wait_until(
            lambda: "beta" not in index_of(client), 60, "beta to leave the index", errors=(InferenceServerException,)
        )
        assert not client.is_model_ready("beta")
        client.close()


def test_model_whose_instances_all_died_is_not_ready(tmp_path):
    identity(tmp_path, "lonely")
    with running_cluster(tmp_path, supervise=False) as running:
        client = httpclient.InferenceServerClient(running.url, network_timeout=60)
        assert client.is_model_ready("lonely")
        running.cluster.child("worker-0").process.kill()
        wait_until(
            lambda: not client.is_model_ready("lonely"),
            60,
            "lonely to become not ready",
            errors=(InferenceServerException,),
        )
        entry = {e["name"]: e for e in client.get_model_repository_index()}["lonely"]
        assert entry["state"] == "UNAVAILABLE" and "no worker hosts" in entry["reason"]
        assert not client.is_server_ready()
        running.cluster.restart("worker-0")
        wait_until(
            lambda: client.is_model_ready("lonely"), 60, "lonely to come back", errors=(InferenceServerException,)
        )
        infer_identity(client, "lonely")
        client.close()


def test_version_policy_change_takes_effect_on_reload(eclient, explicit_repo):
    model = identity(explicit_repo, "versioned")
    examples.write_model(
        explicit_repo, "versioned", examples.identity_graph(TensorProto.FLOAT, 2, "versioned"), None, version=2
    )
    eclient.load_model("versioned")
    assert eclient.get_model_metadata("versioned")["versions"] == ["2"]
    with pytest.raises(InferenceServerException) as err:
        eclient.get_model_metadata("versioned", "1")
    assert err.value.status() == "404" and "version 1 is not found" in err.value.message()
    config = eclient.get_model_config("versioned")
    config["version_policy"] = {"all": {}}
    eclient.load_model("versioned", config=json.dumps(config))
    assert eclient.get_model_metadata("versioned")["versions"] == ["1", "2"]
    assert eclient.is_model_ready("versioned", "1")
    eclient.load_model("versioned")  # back to the repository's config: latest only
    assert not eclient.is_model_ready("versioned", "1")
    assert eclient.is_model_ready("versioned", "2")
    assert model.exists()


def test_model_file_outside_the_repository_is_refused(eclient, explicit_repo, tmp_path):
    config = eclient.get_model_config("first")
    config["default_model_filename"] = "../../../../../../etc/hostname"
    with pytest.raises(InferenceServerException) as err:
        eclient.load_model("first", config=json.dumps(config))
    assert err.value.status() == "400" and "outside the model directory" in err.value.message()
    assert eclient.is_model_ready("first")  # the old version keeps serving
    outside = tmp_path / "outside.onnx"
    outside.write_bytes((explicit_repo / "first" / "1" / "model.onnx").read_bytes())
    linked = identity(explicit_repo, "linked")
    (linked / "1" / "model.onnx").unlink()
    (linked / "1" / "model.onnx").symlink_to(outside)
    with pytest.raises(InferenceServerException) as err:
        eclient.load_model("linked")
    assert "outside the model directory" in err.value.message()


def test_model_names_cannot_leave_the_repository(explicit):
    for name in ("..", ".hidden"):
        status, _, raw = http(explicit.url, f"/v2/repository/models/{name}/load", "POST", b"")
        assert status in (400, 404), (name, status, raw)


def test_failed_reload_keeps_serving_even_for_a_restarted_worker(explicit, eclient):
    eclient.load_model("first")
    config = eclient.get_model_config("first")
    broken = dict(config, default_model_filename="missing.onnx")
    with pytest.raises(InferenceServerException) as err:
        eclient.load_model("first", config=json.dumps(broken))
    assert err.value.status() == "400" and "missing.onnx" in err.value.message()
    infer_identity(eclient, "first")  # the old version never stopped
    assert eclient.get_model_config("first").get("default_model_filename") == "model.onnx"
    worker = explicit.cluster.child("worker-0")
    pid = worker.process.pid
    worker.process.kill()  # the supervisor starts a new worker: it must load the serving version
    wait_until(lambda: worker.process.pid != pid, 60, "the worker restart", errors=(InferenceServerException,))

    def served() -> bool:  # requests caught by the dead worker fail (503) until it is declared gone
        try:
            infer_identity(eclient, "first")
            return True
        except InferenceServerException as exc:
            assert exc.status() == "503", exc
            return False

    wait_until(served, 60, "first to be served by the new worker", errors=(InferenceServerException,))
    assert eclient.get_model_config("first").get("default_model_filename") == "model.onnx"

"""Models on demand: a request loads its model; the least recently used idle models make room.

One worker that holds at most 3 models, one of them pinned (`--load-model`), against the real
services (docs/models.md, "Models on demand"); then two workers of one model each.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from services.repository import examples
from shared.bus import buckets, connection
from shared.wire import subjects
from shared.wire.records import ModelRecord
from shoal import topology
from tests.cluster import Running, identity_config, running_cluster
from tests.integration.many_models import _ensemble_config
from tests.serving import wait_until

MODELS = [f"od{i}" for i in range(10)]
SEQUENCE = "sequence_batching { max_sequence_idle_microseconds: 30000000 direct { } }\n"


def _identity(root: Path, name: str, extra: str = "") -> None:
    examples.write_model(
        root, name, examples.identity_graph(TensorProto.FLOAT, 2, name), identity_config(name, "FP32", 8, extra)
    )


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("on_demand")
    for name in [*MODELS, "pinned", "seq", "member_a", "member_b"]:
        _identity(root, name, SEQUENCE if name == "seq" else "")
    (root / "pair").mkdir()
    (root / "pair" / "1").mkdir()
    (root / "pair" / "config.pbtxt").write_text(_ensemble_config("pair", "member_a", "member_b"))
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    (root / "broken" / "config.pbtxt").write_text(identity_config("broken", "FP32"))
    return root


@pytest.fixture(scope="module")
def cluster(repository: Path) -> Iterator[Running]:
    with running_cluster(
        repository,
        repository={"model_control_mode": "on-demand", "load_model": ["pinned"]},
        worker={"max_loaded_models": 3},
    ) as running:
        yield running


class HostedWatch:
    """Follows the models bucket on a thread of its own: the most models hosted at any revision."""

    def __init__(self, nats_url: str) -> None:
        self.hosted: dict[str, bool] = {}
        self.most = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._task = asyncio.run_coroutine_threadsafe(self._begin(nats_url), self._loop).result(10)

    async def _begin(self, url: str) -> asyncio.Task[None]:
        return asyncio.create_task(self._watch(url))

    async def _watch(self, url: str) -> None:
        nc = await connection.connect(url, "test-hosted-watch")
        try:
            kv = await buckets.bucket(nc, subjects.MODELS_BUCKET)
            async for change in buckets.watch(nc, kv):
                if change.key:
                    record = msgspec.msgpack.decode(change.value, type=ModelRecord) if change.value else None
                    name = subjects.untoken(change.key)
                    self.hosted[name] = bool(record and record.hosted and record.config.get("platform") != "ensemble")
                    self.most = max(self.most, sum(self.hosted.values()))
        finally:
            await nc.close()

    async def _end(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._end(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


def _infer(client: httpclient.InferenceServerClient, model: str, value: float = 1.0, **kwargs) -> None:
    data = np.full((1, 4), value, dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer(model, [tensor], **kwargs).as_numpy("OUTPUT0"), data)


def _metric(running: Running, name: str, **labels: str) -> float:
    with urllib.request.urlopen(running.metrics_url, timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _ready(client: httpclient.InferenceServerClient) -> set[str]:
    return {e["name"] for e in client.get_model_repository_index() if e.get("state") == "READY"}


def test_concurrent_first_requests_load_the_model_once(cluster: Running) -> None:
    client = httpclient.InferenceServerClient(cluster.url, concurrency=20)
    assert "od0" not in _ready(client)
    with ThreadPoolExecutor(20) as pool:
        list(pool.map(lambda _: _infer(httpclient.InferenceServerClient(cluster.url), "od0"), range(20)))
    assert _metric(cluster, "shoal_model_loads_total", model="od0") == 1
    assert next(e for e in client.get_model_repository_index() if e["name"] == "od0")["state"] == "READY"


def test_a_grpc_request_loads_its_model_too(cluster: Running) -> None:
    client = grpcclient.InferenceServerClient(cluster.grpc_url)
    data = np.full((1, 4), 2.0, dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("od1", [tensor]).as_numpy("OUTPUT0"), data)
    assert _metric(cluster, "shoal_model_loads_total", model="od1") == 1


def test_round_robin_over_ten_models_keeps_at_most_three_loaded(cluster: Running) -> None:
    client = httpclient.InferenceServerClient(cluster.url)
    watch = HostedWatch(cluster.nats.url)
    try:
        wait_until(lambda: "pinned" in watch.hosted, 10, "the watch caught up")
        for _ in range(2):
            for model in MODELS:
                _infer(client, model)
    finally:
        watch.stop()
    assert 1 < watch.most <= 3
    assert "pinned" in _ready(client)  # never evicted
    assert _metric(cluster, "shoal_model_evictions_total", model="pinned") == 0
    assert _metric(cluster, "shoal_model_evictions_total", reason="model count") >= 10
    assert _metric(cluster, "shoal_model_thrash_total") >= 1  # every model came back within the window


def test_a_model_holding_a_sequence_is_not_evicted(cluster: Running) -> None:
    client = httpclient.InferenceServerClient(cluster.url)
    _infer(client, "seq", 1.0, sequence_id=7, sequence_start=True)
    for model in MODELS[:4]:  # one slot left beside `pinned` and `seq`
        _infer(client, model)
    assert {"seq", "pinned"} <= _ready(client)
    _infer(client, "seq", 2.0, sequence_id=7, sequence_end=True)
    assert _metric(cluster, "shoal_model_evictions_total", model="seq") == 0


def test_an_ensemble_loads_its_members(cluster: Running) -> None:
    client = httpclient.InferenceServerClient(cluster.url)
    _infer(client, "pair", 3.0)
    assert {"pair", "member_a", "member_b"} <= _ready(client)


def test_a_model_that_fails_to_load_answers_every_waiting_request(cluster: Running) -> None:
    def attempt(_: int) -> str:
        try:
            _infer(httpclient.InferenceServerClient(cluster.url), "broken")
        except InferenceServerException as exc:
            return f"{exc.status()} {exc.message()}"
        return "served"

    with ThreadPoolExecutor(5) as pool:
        answers = list(pool.map(attempt, range(5)))
    assert all(re.match(r"503 load failed for model 'broken': .*protobuf", a, re.I) for a in answers), answers


def test_a_load_longer_than_the_request_timeout_is_a_503(cluster: Running) -> None:
    client = httpclient.InferenceServerClient(cluster.url)
    with pytest.raises(InferenceServerException) as error:
        _infer(client, "od5", timeout=1)  # one microsecond: no load is that fast
    assert error.value.status() == "503"
    assert "load failed for model 'od5': not loaded within the request's timeout" in error.value.message()
    wait_until(lambda: "od5" in _ready(client), 30, "the load went on")  # and the next request finds it
    _infer(client, "od5")


def test_unknown_model_is_still_not_found(cluster: Running) -> None:
    client = httpclient.InferenceServerClient(cluster.url)
    with pytest.raises(InferenceServerException) as error:
        _infer(client, "no_such_model")
    assert error.value.status() == "404"
    assert "Request for unknown model: 'no_such_model'" in error.value.message()


def test_an_explicit_load_pins_until_unloaded(cluster: Running) -> None:
    client = httpclient.InferenceServerClient(cluster.url)
    client.load_model("od9")
    evicted = _metric(cluster, "shoal_model_evictions_total", model="od9")
    for model in MODELS[:4]:  # beside `pinned` and `od9`, one slot serves the other models in turn
        _infer(client, model)
    assert "od9" in _ready(client)
    assert _metric(cluster, "shoal_model_evictions_total", model="od9") == evicted
    client.unload_model("od9")
    _infer(client, "od9")  # now loaded on demand, and evictable
    for model in MODELS[:3]:
        _infer(client, model)
    assert _metric(cluster, "shoal_model_evictions_total", model="od9") == evicted + 1


BIG_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.weights = np.ones(6 << 20, dtype=np.float32)  # 24 MiB, held while the model is loaded

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""


def test_placement_prefers_the_worker_with_room_under_a_memory_budget(tmp_path: Path) -> None:
    for name in ("big0", "big1", "big2"):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.py").write_text(BIG_MODEL)
        config = identity_config(name, "FP32").replace('backend: "onnxruntime"', 'backend: "python"')
        (tmp_path / name / "config.pbtxt").write_text(config)
    with running_cluster(
        tmp_path,
        workers=2,
        repository={"model_control_mode": "on-demand"},
        worker={"model_memory_budget": "40M", "python_isolation": "none"},
    ) as running:
        client = httpclient.InferenceServerClient(running.url)
        budgets = "shoal_worker_model_memory_budget_bytes"
        wait_until(lambda: _metric(running, budgets) == 2 * (40 << 20), 30, "both workers heard")
        _infer(client, "big0")
        _infer(client, "big1")  # 24 MiB more would not fit beside big0: the other worker takes it
        assert {"big0", "big1"} <= _ready(client)
        sizes = {e["name"]: e.get("memory_bytes", 0) for e in client.get_model_repository_index()}
        assert sizes["big0"] >= 20 << 20 and sizes["big1"] >= 20 << 20, sizes
        assert _metric(running, "shoal_model_memory_bytes", model="big1", kind="rss") >= 20 << 20
        assert _metric(running, "shoal_model_evictions_total") == 0
        shown = topology.render(asyncio.run(topology.collect(running.nats.url)))
        assert re.search(r"big[01]/1 x1 \(0 busy, \d\d\.\d MiB\); budget 40\.0 MiB", shown), shown
        _infer(client, "big2")  # no room anywhere: the least recently used goes
        assert _metric(running, "shoal_model_evictions_total", model="big0", reason="memory budget") == 1
        assert _ready(client) >= {"big1", "big2"} and "big0" not in _ready(client)

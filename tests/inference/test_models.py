"""inference/models.py's view of the models bucket (against a real nats-server): a gateway asked for a
model its view does not have yet, loaded a moment ago by another process, catches up with the bucket
before it answers "no such model"."""

from __future__ import annotations

import asyncio

import pytest

from inference.core import InferenceCore
from inference.models import ModelRegistry
from shared.bus import buckets, connection
from shared.bus.dispatch import Dispatcher
from shared.bus.tensor_store import TensorStore
from shared.errors import ShoalError, not_found
from shared.wire import subjects
from shared.wire.messages import encode
from shared.wire.records import ModelRecord, model_key
from tests.scheduler.ensembles.test_ensemble_runner import MEMBER, record


async def test_a_view_behind_the_bucket_catches_up_before_it_says_no_such_model(nats_server):
    nc = await connection.connect(nats_server.url, "test-models-view")
    try:
        kv = await buckets.bucket(nc, subjects.MODELS_BUCKET)
        registry = ModelRegistry()
        registry.kv = kv  # this test plays the watch: it decides when the view applies a record
        known = record("known", MEMBER)
        registry.apply("known", encode(known), await buckets.put(kv, subjects.model_key("known"), encode(known)))
        assert not await registry.caught_up()  # current: nothing to wait for, nothing new
        late = record("late", MEMBER)
        newest = await buckets.put(kv, subjects.model_key("late"), encode(late))  # loaded elsewhere just now
        with pytest.raises(ShoalError, match="unknown model") as missing:
            registry.resolve("late")
        core = InferenceCore(registry, Dispatcher(nc, "gw", TensorStore(nc, "gw")), TensorStore(nc, "gw"), 5.0)
        waiting = asyncio.create_task(core.resolve_late("late", "", missing.value))  # what infer does on a miss
        await asyncio.sleep(0)  # let it start: it notes where the view is, then asks the bucket
        registry.apply("late", encode(late), newest)
        assert (await waiting)[1] == 1
        with pytest.raises(ShoalError, match="'nowhere' is not found"):  # really unknown: the view's answer
            await core.resolve_late("nowhere", "", not_found("Request for unknown model: 'nowhere' is not found"))
    finally:
        await nc.close()


def namespaced(namespace: str, name: str) -> ModelRecord:
    model = record(name, MEMBER)
    model.name, model.namespace = model_key(namespace, name), namespace
    return model


def test_a_clients_name_addresses_the_one_model_of_that_name_across_namespaces():
    registry = ModelRegistry()
    first = namespaced("/a", "m")
    registry.apply(first.name, encode(first), 1)
    spec, version = registry.resolve("m")
    assert (spec.name, spec.model_name, version) == ("/a::m", "m", 1)  # routed by identity, named by name
    assert registry.ready_versions("m") == (1,) and registry.is_ready("m")
    second = namespaced("/b", "m")
    registry.apply(second.name, encode(second), 2)
    ambiguous = "There are 2 identifiers of model 'm' in global map, model namespace must be provided"
    with pytest.raises(ShoalError, match=ambiguous):
        registry.resolve("m")
    assert not registry.is_ready("m") and registry.ready_versions("m") == ()
    registry.apply(first.name, None, 3)  # one left: unambiguous again
    assert registry.resolve("m")[0].name == "/b::m"

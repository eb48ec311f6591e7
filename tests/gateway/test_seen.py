"""services/gateway/seen.py with shared/repository_client.py's `gateways_have`, against a real
nats-server: a loader that is not a gateway learns when every gateway's view has its load."""

from __future__ import annotations

import asyncio

from inference.models import ModelRegistry
from services.gateway.seen import SeenAnswers
from shared import bus, discovery
from shared.repository_client import gateways_have
from shared.wire import subjects
from shared.wire.messages import encode
from shared.wire.records import ModelRecord
from shared.wire.status import GatewayStatus


async def gateway(url: str, name: str):
    """What of a gateway answers: its registry watching the models bucket, registered on NATS micro."""
    nc = await bus.connect(url, name)
    registry = ModelRegistry()
    await registry.start(nc)
    answers = SeenAnswers(nc, registry)
    await answers.start()
    micro = await discovery.register(nc, "gateway", name, lambda: GatewayStatus("", "off", 0, 0, 0))
    await bus.settled(nc)
    return nc, registry, answers, micro


async def test_every_gateway_answers_once_its_view_has_the_revision(nats_server):
    loader = await bus.connect(nats_server.url, "test-loader")
    kv = await bus.bucket(loader, subjects.MODELS_BUCKET)
    assert await gateways_have(loader, 10**9, 0.5)  # no gateway runs: nothing to wait for
    first, second = await gateway(nats_server.url, "gw-a"), await gateway(nats_server.url, "gw-b")
    try:
        revision = await bus.put(kv, subjects.model_key("m"), encode(ModelRecord("m")))
        assert await gateways_have(loader, revision, 10.0)
        assert all("m" in g[1].records for g in (first, second))
        # a revision not written yet: the gateways answer when it is
        waiting = asyncio.create_task(gateways_have(loader, revision + 1, 10.0))
        await bus.put(kv, subjects.model_key("n"), encode(ModelRecord("n")))
        assert await waiting
        assert all("n" in g[1].records for g in (first, second))
        # one that never comes: not seen, answered when the asker's time is up
        assert not await gateways_have(loader, revision + 100, 0.5)
    finally:
        for nc, registry, answers, micro in (first, second):
            await answers.stop()
            await micro.stop()
            await registry.stop()
            await nc.close()
        await loader.close()

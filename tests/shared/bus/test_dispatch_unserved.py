"""shared/bus/dispatch.py against a real nats-server: a request that finds no scheduler subscribed to
its model waits for one (a lease on its way to a replica) and is served once one subscribes;
without one it fails with the reason before its deadline; a model no longer loaded fails at once."""

from __future__ import annotations

import asyncio
import time

import msgspec
import nats
import pytest

from shared.bus import connection
from shared.bus.dispatch import Dispatcher
from shared.bus.tensor_store import TensorStore
from shared.errors import ShoalError
from shared.wire import subjects
from shared.wire.messages import InferRequest, InferResponse, RequestBatch, encode
from tests.serving import until


async def _dispatcher(url: str, loaded=None) -> tuple[nats.NATS, Dispatcher]:
    nc = await nats.connect(url)
    dispatcher = Dispatcher(nc, "gw", TensorStore(nc, "gw"), loaded=loaded)
    await dispatcher.start()
    return nc, dispatcher


def _request(dispatcher: Dispatcher, model: str, timeout_s: float) -> InferRequest:
    deadline_ns = time.time_ns() + int(timeout_s * 1e9)
    return InferRequest(dispatcher.new_rid(), model, 1, dispatcher.inbox, deadline_ns)


async def _scheduler(url: str, model: str, seen: list[str]) -> nats.NATS:
    """Answers each request of `model` as a worker would: an `InferResponse` on its reply inbox."""
    nc = await nats.connect(url)
    decoder = msgspec.msgpack.Decoder(RequestBatch)

    async def take(msg) -> None:
        for raw in decoder.decode(msg.data).requests:
            request = msgspec.msgpack.decode(raw, type=InferRequest)
            seen.append(request.rid)
            await nc.publish(f"{request.reply}.{request.rid}", encode(InferResponse(request.rid)))

    await nc.subscribe(subjects.infer(model), cb=take)
    await connection.settled(nc)
    return nc


async def test_a_request_waits_for_a_scheduler_to_subscribe(nats_server):
    nc, dispatcher = await _dispatcher(nats_server.url)
    seen: list[str] = []
    request = _request(dispatcher, "late", 10)
    answer = asyncio.ensure_future(dispatcher.infer(request, 10))
    await until(lambda: dispatcher.resent[("late", "no_scheduler")], 5, 'NATS saying "no responders"')
    assert dispatcher.resent[("late", "no_scheduler")] == 1 and not answer.done()
    scheduler = await _scheduler(nats_server.url, "late", seen)
    response = await asyncio.wait_for(answer, 5)
    assert response.rid == request.rid and seen == [request.rid]  # sent again, received once
    await scheduler.close()
    await nc.close()


async def test_without_a_scheduler_the_reason_comes_before_the_deadline(nats_server):
    nc, dispatcher = await _dispatcher(nats_server.url)
    started = time.monotonic()
    with pytest.raises(ShoalError) as err:
        await dispatcher.infer(_request(dispatcher, "nobody", 1.0), 1.0)
    assert err.value.message.startswith("no scheduler is serving requests for model 'nobody' (waited")
    assert 0.5 < time.monotonic() - started < 1.5  # the reason, not "Request timeout expired"
    await nc.close()


async def test_a_model_no_longer_loaded_fails_at_once(nats_server):
    nc, dispatcher = await _dispatcher(nats_server.url, loaded=lambda model: False)
    started = time.monotonic()
    with pytest.raises(ShoalError) as err:
        await dispatcher.infer(_request(dispatcher, "gone", 10), 10)
    assert err.value.message == "no scheduler is serving requests for model 'gone': it is no longer loaded"
    assert time.monotonic() - started < 2
    await nc.close()

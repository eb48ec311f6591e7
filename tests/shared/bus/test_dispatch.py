"""shared/bus/dispatch.py against a real nats-server, with a scheduler played by a subscription on the
model's infer subject (and, for a co-hosted scheduler, a fake of the module's `LocalScheduler`
protocol): grouping, answers, streams, no responders, deadlines and cancels."""

from __future__ import annotations

import asyncio
import itertools
import time

import msgspec
import nats
import pytest

from shared.bus import connection
from shared.bus.dispatch import Dispatcher
from shared.bus.tensor_store import TensorStore
from shared.errors import Code, ShoalError
from shared.wire import subjects
from shared.wire.messages import (
    BatchDone,
    CancelRequest,
    InferRequest,
    InferResponse,
    InstanceFree,
    RequestBatch,
    ResponseBatch,
    encode,
)
from tests.serving import until

_ids = itertools.count()


@pytest.fixture
async def nc(nats_server):
    connection = await nats.connect(nats_server.url)
    yield connection
    await connection.close()


async def dispatcher(nc: nats.NATS, local=None) -> Dispatcher:
    gateway = f"test{next(_ids)}"
    started = Dispatcher(nc, gateway, TensorStore(nc, gateway, transport="bus"), local)
    await started.start()
    return started


def request(d: Dispatcher, model: str) -> InferRequest:
    rid = d.new_rid()
    return InferRequest(rid, model, 1, d.reply_subject(rid), 2**62)


class Scheduler:
    """Takes a model's request groups; answers each request at once unless told to hold them."""

    def __init__(self, nc: nats.NATS, model: str, answer: bool = True) -> None:
        self.nc, self.model, self.answer = nc, model, answer
        self.groups: list[list[InferRequest]] = []

    async def start(self) -> Scheduler:
        async def on_group(msg) -> None:
            batch = msgspec.msgpack.decode(msg.data, type=RequestBatch)
            group = [msgspec.msgpack.decode(r, type=InferRequest) for r in batch.requests]
            self.groups.append(group)
            for r in group if self.answer else []:
                await self.nc.publish(r.reply, encode(InferResponse(r.rid, model=f"done {r.rid}")))

        await self.nc.subscribe(subjects.infer(self.model), cb=on_group)
        await connection.settled(self.nc)
        return self


async def test_requests_started_together_leave_as_one_message_per_model_and_each_gets_its_answer(nc):
    d = await dispatcher(nc)
    a, b = await Scheduler(nc, "a").start(), await Scheduler(nc, "b").start()
    requests = [request(d, "a") for _ in range(3)] + [request(d, "b")]
    answers = await asyncio.gather(*(d.infer(r, 10) for r in requests))
    assert [x.model for x in answers] == [f"done {r.rid}" for r in requests]
    assert [[r.rid for r in g] for g in a.groups] == [[r.rid for r in requests[:3]]]
    assert len(b.groups) == 1 and d.in_flight == 0


async def test_no_scheduler_for_the_model_fails_before_the_deadline_with_a_clear_error(nc):
    d = await dispatcher(nc)
    sent = request(d, "nobody-serves-this")
    sent.deadline_ns = time.time_ns() + 500_000_000  # retried while a scheduler may claim it, not past this
    with pytest.raises(ShoalError) as err:
        await d.infer(sent, 10)
    assert err.value.message.startswith("no scheduler is serving requests for model 'nobody-serves-this' (waited ")
    assert err.value.message.endswith("s; is the scheduler running?)")
    assert err.value.code == Code.UNAVAILABLE


async def test_a_request_for_a_model_no_longer_loaded_fails_at_once(nc):
    gateway = f"test{next(_ids)}"
    d = Dispatcher(nc, gateway, TensorStore(nc, gateway, transport="bus"), loaded=lambda model: False)
    await d.start()
    with pytest.raises(ShoalError) as err:
        await d.infer(request(d, "evicted"), 10)
    assert err.value.message == "no scheduler is serving requests for model 'evicted': it is no longer loaded"


async def test_a_request_past_its_deadline_fails_and_its_scheduler_is_told(nc):
    d = await dispatcher(nc)
    await Scheduler(nc, "slow", answer=False).start()
    cancels: list[CancelRequest] = []

    async def on_cancel(msg) -> None:
        cancels.append(msgspec.msgpack.decode(msg.data, type=CancelRequest))

    await nc.subscribe(subjects.SCHEDULER_CANCEL, cb=on_cancel)
    sent = request(d, "slow")
    with pytest.raises(ShoalError, match="Request timeout expired"):
        await d.infer(sent, 0.2)
    assert d.in_flight == 0
    task = asyncio.ensure_future(d.infer(request(d, "slow"), 10))
    await until(lambda: d.in_flight == 1)
    task.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: len(cancels) == 1)
    assert cancels[0].model == "slow" and d.in_flight == 0


async def test_a_stream_yields_every_response_until_the_final_one(nc):
    d = await dispatcher(nc)
    scheduler = await Scheduler(nc, "decoupled", answer=False).start()
    sent = request(d, "decoupled")
    got: list[InferResponse] = []

    async def read() -> None:
        async for response in d.stream(sent, 10):
            got.append(response)

    reader = asyncio.ensure_future(read())
    await until(lambda: len(scheduler.groups) == 1)
    for n in range(3):
        await nc.publish(sent.reply, encode(InferResponse(sent.rid, model=str(n), more=n < 2)))
    await asyncio.wait_for(reader, 10)
    assert [r.model for r in got] == ["0", "1", "2"] and d.in_flight == 0


async def test_answers_batched_for_the_inbox_resolve_each_request(nc):
    d = await dispatcher(nc)
    scheduler = await Scheduler(nc, "batched", answer=False).start()
    sent = [request(d, "batched") for _ in range(2)]
    waiting = asyncio.gather(*(d.infer(r, 10) for r in sent))
    await until(lambda: len(scheduler.groups) == 1)
    answers = [msgspec.Raw(encode(InferResponse(r.rid, model="ok"))) for r in sent]
    await nc.publish(f"{d.inbox}.batch", encode(ResponseBatch(answers)))
    assert [r.model for r in await asyncio.wait_for(waiting, 10)] == ["ok", "ok"]


class CoHosted:
    """A scheduler in this process (the `LocalScheduler` protocol): it owns `model`."""

    def __init__(self, model: str, broken: bool = False) -> None:
        self.model, self.broken = model, broken
        self.taken: list[InferRequest] = []
        self.freed: list[InstanceFree] = []

    def owns(self, model: str) -> bool:
        return model == self.model

    async def take(self, requests: list[msgspec.Raw]) -> None:
        if self.broken:
            raise RuntimeError("broken")
        self.taken += [msgspec.msgpack.decode(r, type=InferRequest) for r in requests]

    async def completed(self, free: InstanceFree) -> None:
        self.freed.append(free)


async def test_a_co_hosted_scheduler_takes_its_models_requests_by_call_not_over_the_bus(nc):
    local = CoHosted("here")
    d = await dispatcher(nc, local)
    over_bus = await Scheduler(nc, "here").start()  # another replica: must not see them
    sent = request(d, "here")
    waiting = asyncio.ensure_future(d.infer(sent, 10))
    await until(lambda: len(local.taken) == 1)
    assert local.taken[0].rid == sent.rid and over_bus.groups == []
    free = InstanceFree("w", "here", 1, 0, "exec", batch_id=7)
    done = BatchDone(free, [msgspec.Raw(encode(InferResponse(sent.rid, model="local")))])
    await nc.publish(f"{d.inbox}.done", encode(done))
    assert (await asyncio.wait_for(waiting, 10)).model == "local"
    await until(lambda: len(local.freed) == 1)  # the answers first, then the credit
    assert local.freed[0].batch_id == 7


async def test_a_co_hosted_scheduler_that_fails_fails_the_requests_never_loses_them(nc):
    d = await dispatcher(nc, CoHosted("here", broken=True))
    with pytest.raises(ShoalError, match="the scheduler failed: broken"):
        await d.infer(request(d, "here"), 10)

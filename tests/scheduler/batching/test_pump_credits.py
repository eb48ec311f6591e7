"""services/scheduler/batching/pump.py and credits.py, with the dynamic batcher's discipline
(`dynamic.py`), against a real nats-server: a worker's exec subject and the clients' inboxes are
real subscriptions."""

from __future__ import annotations

import time

import msgspec
import nats
import pytest

from services.scheduler.batching.answers import Answers
from services.scheduler.batching.credits import FLIGHT_GRACE_S, Credits
from services.scheduler.batching.dynamic import DynamicBatcher
from services.scheduler.batching.flights import Flights
from services.scheduler.batching.pump import Pump
from services.scheduler.batching.ratelimit import RateLimiter
from services.scheduler.discipline_factory import DisciplineFactory
from services.scheduler.scheduling_records import Pending, Slot
from services.scheduler.sequences.sequence_batcher import SequenceBatcher
from services.scheduler.tasks import Tasks
from shared.bus import connection
from shared.config.model_config import spec_from_json
from shared.errors import Code
from shared.wire.messages import (
    CreditsRevoked,
    ExecBatch,
    InferResponse,
    InstanceFree,
    RequestDone,
    RequestHeader,
    encode,
)
from tests.serving import until

EXEC = "test.worker.w.exec"
INBOX = "test.inbox"


class Bench:
    """A pump and its credits on a real connection; what reached the worker and the clients."""

    def __init__(self, nc: nats.NATS) -> None:
        self.nc = nc
        flights, answers = Flights(), Answers(nc.publish)
        self.pump = Pump(nc, RateLimiter(), Tasks(), flights, answers, DisciplineFactory(nc.publish))
        self.credits = Credits(self.pump, flights, answers)
        self.queue = self.pump.queue("m", 1)
        assert isinstance(self.queue.discipline, DynamicBatcher)  # a model that is not sequence-batched
        self.requests = self.queue.discipline.requests
        self.batches: list[ExecBatch] = []
        self.answers: dict[str, InferResponse] = {}

    async def start(self) -> Bench:
        async def on_batch(msg) -> None:
            self.batches.append(msgspec.msgpack.decode(msg.data, type=ExecBatch))

        async def on_answer(msg) -> None:
            answer = msgspec.msgpack.decode(msg.data, type=InferResponse)
            self.answers[answer.rid] = answer

        await self.nc.subscribe(EXEC, cb=on_batch)
        await self.nc.subscribe(INBOX, cb=on_answer)
        await connection.settled(self.nc)
        return self

    async def admit(self, rid: str, deadline_s: float = 30.0, route: tuple[int, ...] = ()) -> None:
        deadline_ns = time.time_ns() + int(deadline_s * 1e9)
        header = RequestHeader(rid, "m", 1, INBOX, deadline_ns, received_ns=time.time_ns(), route=list(route))
        assert await self.pump.admit(self.queue, header, msgspec.Raw(encode(header)), time.monotonic())

    def taken(self) -> list[Pending]:
        """The queued requests, out of the queue: a test dispatches them itself."""
        return self.requests.remove(lambda _: True)

    def credit(self, instance: int = 0, credit: int = 0) -> Slot:
        return Slot("w", instance, credit, EXEC)

    async def free(self, slot: Slot, batch_id: int = -1, done: list[str] = ()) -> None:
        await self.credits.on_free(
            InstanceFree(
                "w", "m", 1, slot.instance, EXEC, slot.credit, batch_id=batch_id,
                batch_size=len(done), done=[RequestDone(rid, True) for rid in done],
            )
        )  # fmt: skip

    def rids(self, batch: ExecBatch) -> list[str]:
        return [msgspec.msgpack.decode(r, type=RequestHeader).rid for r in batch.requests]


@pytest.fixture
async def bench(nats_server):
    nc = await nats.connect(nats_server.url)
    yield await Bench(nc).start()
    await nc.close()


async def test_a_request_goes_out_on_a_credit_and_its_completion_brings_the_credit_back(bench):
    await bench.admit("r1")
    await bench.admit("r2")
    assert bench.batches == []  # no credit yet: queued
    slot = bench.credit()
    await bench.free(slot)  # an idle instance announces its credit
    await until(lambda: len(bench.batches) == 1)
    first = bench.batches[0]
    assert bench.rids(first) == ["r1"] and first.instance == 0 and len(bench.requests) == 1
    assert bench.pump.pending(bench.queue) == 1 and not bench.pump.idle(("m", 1))
    await bench.free(slot, first.batch_id, done=["r1"])  # r1 answered by the worker itself
    await until(lambda: len(bench.batches) == 2)
    assert bench.rids(bench.batches[1]) == ["r2"]
    await bench.free(slot, bench.batches[1].batch_id, done=["r2"])
    assert bench.pump.idle(("m", 1)) and list(bench.queue.free) == [slot] and bench.answers == {}
    assert bench.queue.stats.success.count == 2 and bench.queue.stats.execution_count == 2


async def test_a_stale_announcement_of_a_credit_in_flight_is_ignored(bench):
    slot = bench.credit()
    await bench.admit("r1")
    await bench.free(slot)
    await until(lambda: len(bench.batches) == 1)
    await bench.free(slot)  # sent by the worker before the batch arrived: the credit is in flight
    assert not bench.queue.free


async def test_a_request_the_worker_did_not_report_is_failed_not_lost(bench):
    slot = bench.credit()
    await bench.admit("r1")
    await bench.free(slot)
    await until(lambda: len(bench.batches) == 1)
    await bench.free(slot, bench.batches[0].batch_id, done=[])
    await until(lambda: "r1" in bench.answers)
    assert bench.answers["r1"].error == "request was lost by worker w"


async def test_another_replicas_completion_changes_nothing_here(bench):
    slot = bench.credit()
    await bench.admit("r1")
    await bench.free(slot)
    await until(lambda: len(bench.batches) == 1)
    await bench.free(slot, bench.batches[0].batch_id + 1, done=["r1"])  # not a batch of ours
    assert bench.pump.flights.count(("m", 1)) == 1 and bench.answers == {}


async def test_a_lost_worker_fails_what_ran_and_requeues_what_waited_behind_it(bench):
    now = time.monotonic()
    for rid in ("running", "behind"):
        await bench.admit(rid)
    queue, pending = bench.queue, bench.taken()
    assert await bench.pump.send(queue, bench.credit(0, 0), [pending[0]], now, "test")
    assert await bench.pump.send(queue, bench.credit(0, 1), [pending[1]], now, "test")  # sent ahead
    await bench.credits.worker_lost("w")
    await until(lambda: "running" in bench.answers)
    assert "stopped responding" in bench.answers["running"].error
    assert [p.header.rid for p in bench.requests] == ["behind"] and bench.requests[0].retried
    assert queue.stats.retries == 1 and bench.pump.flights.count(("m", 1)) == 0


async def test_batches_lost_in_transit_run_again_and_their_credit_returns(bench):
    now = time.monotonic()
    for rid in ("held", "lost", "late"):
        await bench.admit(rid)
    queue, pending = bench.queue, bench.taken()
    for credit, request in enumerate(pending):
        await bench.pump.send(queue, bench.credit(credit, 0), [request], now + credit, "test")
    held, lost, late = sorted(bench.pump.flights.table)  # batch ids grow in sending order
    ended = await bench.credits.lost_in_transit("w", {held[1]}, cutoff=now + 1.5)  # "late" may be on its way
    assert ended == 1
    await until(lambda: len(bench.batches) == 4)  # "lost" went again at once, on the credit it returned
    assert bench.rids(bench.batches[-1]) == ["lost"] and bench.pump.flights.count(("m", 1)) == 3
    assert queue.stats.retries == 1 and bench.answers == {}
    assert (
        lost not in bench.pump.flights.table and held in bench.pump.flights.table and late in bench.pump.flights.table
    )


async def test_a_batch_whose_completion_never_came_is_failed_and_its_credit_returned(bench):
    await bench.admit("gone", deadline_s=-FLIGHT_GRACE_S - 1)  # its deadline and the grace passed
    queue, pending = bench.queue, bench.taken()
    slot = bench.credit()
    await bench.pump.send(queue, slot, pending, time.monotonic(), "test")
    await bench.credits.expire()
    await until(lambda: "gone" in bench.answers)
    assert bench.answers["gone"].error == "the request was lost on its way to or from a worker"
    assert list(queue.free) == [slot] and bench.pump.flights.count(("m", 1)) == 0


async def test_a_revoked_generation_takes_its_credits_along(bench):
    old, new = Slot("w", 0, 0, EXEC, generation=1), Slot("w", 0, 1, EXEC, generation=2)
    bench.queue.free.extend([old, new])
    await bench.credits.revoked(CreditsRevoked("w", "m", 1, 1))
    assert list(bench.queue.free) == [new]


async def test_a_cancelled_request_leaves_the_queue_or_its_waiting_batch_answered_cancelled(bench):
    """As Triton's core finishes a request cancelled in its queue (a BLS stream reads to that answer)."""
    for rid in ("running", "ahead", "queued"):
        await bench.admit(rid)
    queue, pending = bench.queue, bench.taken()
    now = time.monotonic()
    await bench.pump.send(queue, bench.credit(0, 0), [pending[0]], now, "test")
    await bench.pump.send(queue, bench.credit(0, 1), [pending[1]], now, "test")  # waits behind "running"
    bench.requests.append(pending[2])
    assert bench.pump.pending(queue) == 2  # queued here, or sent ahead and not started: as Triton counts
    await bench.pump.cancel(queue, "queued")
    await bench.pump.cancel(queue, "ahead")
    await bench.pump.cancel(queue, "running")  # running: it finishes
    assert bench.pump.pending(queue) == 0 and not bench.requests
    assert queue.stats.fail_reasons == {"CANCELED": 2}
    await until(lambda: len(bench.answers) == 2)
    assert {rid: (a.code, a.error) for rid, a in bench.answers.items()} == {
        rid: (Code.CANCELLED, "Request was cancelled") for rid in ("queued", "ahead")
    }


async def test_a_reload_keeps_the_queue_its_discipline_serves_and_replaces_the_others(bench):
    def spec(**config):
        return spec_from_json({"name": "m", "max_batch_size": 4, **config})

    batcher = bench.queue.discipline
    bench.pump.configure(bench.queue, spec())  # the default scheduler
    await bench.admit("queued")
    bench.pump.configure(bench.queue, spec(dynamic_batching={}))  # the same queue, now batching
    assert bench.queue.discipline is batcher and bench.pump.pending(bench.queue) == 1
    bench.pump.configure(bench.queue, spec(sequence_batching={"direct": {}}))
    assert isinstance(bench.queue.discipline, SequenceBatcher)
    await until(lambda: "queued" in bench.answers)  # what it queued cannot run there: answered, never lost
    assert bench.answers["queued"].error == "model 'm' is now served by the sequence batcher; send the request again"
    assert bench.pump.pending(bench.queue) == 0


async def test_the_autoscaling_signals_follow_the_queue_and_the_instances(bench):
    """docs/scaling.md: the oldest request's wait (queued here or waiting at its instance), and the
    instances holding a batch of all those known by a credit or a batch."""
    assert bench.pump.oldest_wait_s(bench.queue) == 0.0 and bench.pump.instances_in_use(bench.queue) == (0, 0)
    await bench.admit("r1")
    await bench.admit("r2")
    first_wait = bench.pump.oldest_wait_s(bench.queue)
    await until(lambda: bench.pump.oldest_wait_s(bench.queue) > first_wait)  # it grows while nothing runs
    one, other = bench.credit(0), bench.credit(1)
    await bench.free(one)
    await until(lambda: len(bench.batches) == 1)
    assert bench.pump.instances_in_use(bench.queue) == (1, 1)
    waited = bench.pump.oldest_wait_s(bench.queue)
    assert waited > 0  # r2 still waits
    await bench.free(other)
    await until(lambda: len(bench.batches) == 2)
    assert bench.pump.oldest_wait_s(bench.queue) == 0.0 and bench.pump.instances_in_use(bench.queue) == (2, 2)
    await bench.free(one, bench.batches[0].batch_id, done=["r1"])
    assert bench.pump.instances_in_use(bench.queue) == (1, 2)


async def test_a_request_goes_to_the_instance_that_was_sent_its_prefix(bench):
    """Prefix-aware routing (prefix_router.py): two instances with a credit each; a conversation's
    later turns follow its first, another conversation goes to the less loaded instance."""
    slots = [bench.credit(instance=0), bench.credit(instance=1)]
    for slot in slots:
        await bench.free(slot)

    async def turn(rid: str, route: tuple[int, ...]) -> int:
        sent = len(bench.batches)
        await bench.admit(rid, route=route)
        await bench.pump.pump(bench.queue)  # as the scheduler does on an arrival
        await until(lambda: len(bench.batches) == sent + 1)
        batch = bench.batches[sent]
        await bench.free(slots[batch.instance], batch.batch_id, done=[rid])  # joined: the credit is back
        return batch.instance

    system = (7, 8)
    home = await turn("a1", (*system, 100))
    other = await turn("b1", (*system, 200))
    assert other != home
    assert await turn("a2", (*system, 100, 101, 102)) == home
    assert await turn("b2", (*system, 200, 201, 202)) == other
    assert await turn("a3", (*system, 100, 101, 102, 103, 104)) == home
    assert bench.queue.stats.success.count == 5


async def test_without_prefix_routing_the_prefix_changes_nothing(bench):
    bench.pump.prefix_routing = False
    slots = [bench.credit(instance=0), bench.credit(instance=1)]
    for slot in slots:
        await bench.free(slot)
    await bench.admit("a1", route=(1, 2))
    await bench.pump.pump(bench.queue)
    await until(lambda: len(bench.batches) == 1)
    await bench.free(slots[bench.batches[0].instance], bench.batches[0].batch_id, done=["a1"])
    await bench.admit("a2", route=(1, 2, 3))
    await bench.pump.pump(bench.queue)
    await until(lambda: len(bench.batches) == 2)
    # the fewest batches started, as before: the other instance
    assert bench.batches[1].instance != bench.batches[0].instance and len(bench.queue.router) == 0

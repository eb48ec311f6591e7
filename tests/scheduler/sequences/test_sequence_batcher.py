"""services/scheduler/sequences/sequence_batcher.py (`SequenceBatcher`) against in-process fakes
of its own interfaces: the `Host` it needs from the pump, and the `Publish` callable its answers and
the workers' `SequenceEnded` go through. Triton's texts for refused requests, slots and
controls in a dispatched batch, and what a lost worker, a cancel and a reload leave behind."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import msgspec
import pytest

from services.scheduler.batching.formation import Decision
from services.scheduler.batching.model_queue import ModelQueue
from services.scheduler.scheduling_records import InFlight, Key, Pending, Slot
from services.scheduler.sequences.sequence_batcher import SequenceBatcher
from services.scheduler.statistics.reasons import FailReason
from shared.config.model_config import spec_from_json
from shared.config.sequence_config import sequence_config
from shared.wire import subjects
from shared.wire.messages import InferResponse, RequestHeader, SeqControl, SequenceEnded

INBOX = "test.inbox"


class Host:
    """The `Host` fake: records the batches; every instance may run; timers never fire."""

    def __init__(self) -> None:
        self.sent: list[tuple[Slot, list[str], list[SeqControl]]] = []
        self.failed: list[tuple[str, str]] = []
        self.dropped_rids: list[tuple[str, FailReason]] = []
        self.pumps = 0
        self.tasks: list[asyncio.Task[Any]] = []

    max_batch_bytes = 1 << 20

    def can_run(self, queue: ModelQueue, slot: Slot) -> bool:
        return True

    def take_slot(self, queue: ModelQueue, decision: Decision, route: Sequence[int] = ()) -> Slot | None:
        raise AssertionError("the sequence batcher picks its credits itself")

    async def send(
        self,
        queue: ModelQueue,
        slot: Slot,
        batch: list[Pending],
        now: float,
        reason: str,
        controls: list[SeqControl] | None = None,
    ) -> bool:
        self.sent.append((slot, [p.header.rid for p in batch], controls or []))
        return True

    async def pump(self, queue: ModelQueue) -> None:
        self.pumps += 1

    async def fail(
        self, queue: ModelQueue, header: RequestHeader, message: str, reason: FailReason = FailReason.OTHER
    ) -> None:
        self.failed.append((header.rid, message))

    async def dropped(self, queue: ModelQueue, header: RequestHeader, reason: FailReason) -> None:
        self.dropped_rids.append((header.rid, reason))

    def waiting(self, key: Key) -> list[InFlight]:
        return []

    def after(self, delay_s: float, job: Callable[[], Awaitable[Any]]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(3600, lambda: None)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.tasks.append(asyncio.ensure_future(coro))


class Wire:
    """The `Publish` fake: the answers to clients, and what workers are told."""

    def __init__(self) -> None:
        self.answers: dict[str, InferResponse] = {}
        self.ended: list[SequenceEnded] = []

    async def __call__(self, subject: str, data: bytes) -> None:
        if subject == INBOX:
            answer = msgspec.msgpack.decode(data, type=InferResponse)
            self.answers[answer.rid] = answer
        else:
            assert subject == subjects.worker_sequence("w")
            self.ended.append(msgspec.msgpack.decode(data, type=SequenceEnded))


def config(max_batch_size: int = 2, strategy: str = "direct") -> dict[str, Any]:
    return {"name": "m", "max_batch_size": max_batch_size, "sequence_batching": {strategy: {}}}


@pytest.fixture
def bench():
    host, wire = Host(), Wire()
    spec = spec_from_json(config())
    sequencer = SequenceBatcher(host, wire, "m", sequence_config(spec.config))
    queue = ModelQueue(("m", 1), sequencer, spec)
    return sequencer, queue, host, wire


def pending(rid: str, corrid: int | str, start: bool = False, end: bool = False, batch_size: int = 1) -> Pending:
    header = RequestHeader(
        rid, "m", 1, INBOX, time.time_ns() + 10**10, batch_size, received_ns=time.time_ns(),
        sequence_id=corrid, sequence_start=start, sequence_end=end,
    )  # fmt: skip
    return Pending(header, msgspec.Raw(b""), time.monotonic())


async def test_requests_the_sequence_batcher_cannot_take_get_tritons_texts(bench):
    sequencer, queue, _, wire = bench
    assert not await sequencer.admit(queue, pending("none", 0, start=True))
    assert not await sequencer.admit(queue, pending("big", 1, start=True, batch_size=2))
    assert not await sequencer.admit(queue, pending("nostart", 7))
    assert (
        wire.answers["none"].error
        == "inference request to model 'm' must specify a non-zero or non-empty correlation ID"
    )
    assert wire.answers["big"].error == (
        "inference request to model 'm' must specify batch-size 1 due to requirements of sequence batcher"
    )
    assert wire.answers["nostart"].error == (
        "inference request for sequence 7 to model 'm' must specify the START flag on the first request of the sequence"
    )
    assert {a.code for a in wire.answers.values()} == {"INVALID_ARG"}
    assert queue.stats.fail_reasons == {"OTHER": 3}


async def test_sequences_take_the_slots_of_an_instance_and_go_out_with_their_controls(bench):
    sequencer, queue, host, _ = bench
    assert await sequencer.admit(queue, pending("a1", 1, start=True))
    assert await sequencer.admit(queue, pending("b1", "two", start=True, end=True))
    queue.free.append(Slot("w", 0, 0, "exec"))
    await sequencer.pump(queue)
    [(slot, rids, controls)] = host.sent
    assert slot.instance == 0 and not queue.free and sorted(rids) == ["a1", "b1"]
    by_corrid = {c.corrid: c for c in controls}
    assert by_corrid[1].start and not by_corrid[1].end
    assert by_corrid["two"].start and by_corrid["two"].end
    assert sorted(c.slot for c in controls) == [0, 1]  # one batch slot each (direct: max_batch_size slots)


async def test_the_next_request_of_a_sequence_waits_for_its_batch_to_finish(bench):
    sequencer, queue, host, _ = bench
    first, second = pending("a1", 1, start=True), pending("a2", 1)
    await sequencer.admit(queue, first)
    await sequencer.admit(queue, second)
    slot = Slot("w", 0, 0, "exec")
    queue.free.append(slot)
    await sequencer.pump(queue)
    queue.free.append(Slot("w", 0, 1, "exec"))  # a second credit of the same instance
    await sequencer.pump(queue)
    assert [rids for _, rids, _ in host.sent] == [["a1"]]  # a2 waits: one request of a sequence at a time
    sequencer.finished(queue, InFlight(("m", 1), slot, [first], time.monotonic()))
    await sequencer.pump(queue)
    assert [rids for _, rids, _ in host.sent] == [["a1"], ["a2"]]
    assert host.sent[1][2][0].slot == host.sent[0][2][0].slot and not host.sent[1][2][0].start


async def test_a_lost_worker_answers_what_its_sequences_queued(bench):
    sequencer, queue, host, wire = bench
    first, second = pending("a1", 1, start=True), pending("a2", 1)
    await sequencer.admit(queue, first)
    await sequencer.admit(queue, second)
    queue.free.append(Slot("w", 0, 0, "exec"))
    await sequencer.pump(queue)
    await sequencer.worker_lost(queue, "w")
    assert wire.answers["a2"].error == "sequence 1 to model 'm' was lost: worker w stopped responding"
    assert wire.answers["a2"].code == "UNAVAILABLE" and "a1" not in wire.answers  # a1 is its flight's to answer
    assert host.pumps == 1


async def test_a_cancelled_start_frees_its_slot_and_the_worker_is_told(bench):
    sequencer, queue, host, wire = bench
    first, second = pending("a1", 1, start=True), pending("a2", 1, end=True)
    await sequencer.admit(queue, first)
    queue.free.append(Slot("w", 0, 0, "exec"))
    await sequencer.pump(queue)
    sequencer.finished(queue, InFlight(("m", 1), Slot("w", 0, 0, "exec"), [first], time.monotonic()))
    await sequencer.admit(queue, second)
    await sequencer.cancel(queue, "a2")  # its END never reaches the worker
    assert host.dropped_rids == [("a2", FailReason.CANCELED)]  # counted and answered CANCELLED by the pump
    assert [(e.corrid, e.reason) for e in wire.ended] == [(1, "cancelled")]


async def test_a_reload_with_other_slots_ends_the_live_sequences(bench):
    sequencer, queue, _, wire = bench
    await sequencer.admit(queue, pending("a1", 1, start=True))
    assert sequencer.adopt(spec_from_json(config(max_batch_size=2)))  # the same slots: it goes on
    assert sequencer.queued() == 1 and wire.answers == {}
    assert not sequencer.adopt(spec_from_json(config(max_batch_size=4)))  # other slots: replaced (the pump)
    assert not sequencer.adopt(spec_from_json({"name": "m", "max_batch_size": 2}))  # not sequence-batched
    await sequencer.retire(queue)
    assert wire.answers["a1"].error == (
        "sequence 1 to model 'm' was lost: the model was reloaded; start it again with the START flag"
    )
    assert [(e.corrid, e.reason) for e in wire.ended] == []  # it never ran: the worker holds nothing

"""services/scheduler/batching/dynamic.py (`DynamicBatcher`) against an in-process fake of the
`Host` it needs from the pump: what goes out on a free credit, what a bus message can hold,
queue limits and timeouts, and what it does with requests it can no longer run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import msgspec

from services.scheduler.batching.dynamic import DynamicBatcher
from services.scheduler.batching.formation import Decision
from services.scheduler.batching.model_queue import ModelQueue
from services.scheduler.batching.queues import Priorities
from services.scheduler.scheduling_records import InFlight, Key, Pending, Slot
from services.scheduler.statistics.reasons import FailReason
from shared.config.model_config import spec_from_json
from shared.wire.messages import RequestHeader, SeqControl


class Host:
    """The `Host` fake: takes any free credit, records batches and answers; timers never fire."""

    def __init__(self, max_batch_bytes: int = 1 << 20) -> None:
        self.max_batch_bytes = max_batch_bytes
        self.sent: list[list[str]] = []
        self.failed: dict[str, str] = {}
        self.dropped_: dict[str, FailReason] = {}
        self.timers: list[float] = []

    def can_run(self, queue: ModelQueue, slot: Slot) -> bool:
        return True

    def take_slot(self, queue: ModelQueue, decision: Decision, route: Sequence[int] = ()) -> Slot | None:
        return queue.free.popleft() if queue.free else None

    async def send(
        self,
        queue: ModelQueue,
        slot: Slot,
        batch: list[Pending],
        now: float,
        reason: str,
        controls: list[SeqControl] | None = None,
    ) -> bool:
        self.sent.append([p.header.rid for p in batch])
        return True

    async def pump(self, queue: ModelQueue) -> None:
        pass

    async def fail(
        self, queue: ModelQueue, header: RequestHeader, message: str, reason: FailReason = FailReason.OTHER
    ) -> None:
        self.failed[header.rid] = message

    async def dropped(self, queue: ModelQueue, header: RequestHeader, reason: FailReason) -> None:
        self.dropped_[header.rid] = reason

    def waiting(self, key: Key) -> list[InFlight]:
        return []

    def after(self, delay_s: float, job: Callable[[], Awaitable[Any]]) -> asyncio.TimerHandle:
        self.timers.append(delay_s)
        return asyncio.get_running_loop().call_later(3600, lambda: None)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        raise AssertionError("the dynamic batcher spawns nothing")


def bench(config: dict[str, Any], host: Host | None = None) -> tuple[DynamicBatcher, ModelQueue, Host]:
    host = host or Host()
    spec = spec_from_json({"name": "m", "max_batch_size": 8, **config})
    batcher = DynamicBatcher(host, spec)
    queue = ModelQueue(("m", 1), batcher, spec, Priorities.from_json(config.get("dynamic_batching")))
    return batcher, queue, host


def pending(rid: str, size: int = 10, deadline_s: float = 10.0, queue_deadline_ns: int = 0) -> Pending:
    header = RequestHeader(rid, "m", 1, "inbox", time.time_ns() + int(deadline_s * 1e9), received_ns=time.time_ns())
    return Pending(header, msgspec.Raw(b"x" * size), time.monotonic(), queue_deadline_ns=queue_deadline_ns)


async def test_queued_requests_go_in_one_batch_on_a_free_credit():
    batcher, queue, host = bench({"dynamic_batching": {}})
    for rid in ("a", "b", "c"):
        assert await batcher.admit(queue, pending(rid))
    await batcher.pump(queue)
    assert host.sent == []  # no credit: they wait
    queue.free.append(Slot("w", 0, 0, "exec"))
    await batcher.pump(queue)
    assert host.sent == [["a", "b", "c"]] and batcher.queued() == 0


async def test_the_default_scheduler_sends_batches_of_one():
    batcher, queue, host = bench({})
    for rid in ("a", "b"):
        await batcher.admit(queue, pending(rid))
    queue.free.extend([Slot("w", 0, 0, "exec"), Slot("w", 0, 1, "exec")])
    await batcher.pump(queue)
    assert host.sent == [["a"], ["b"]]


async def test_a_batch_holds_no_more_than_one_bus_message_can():
    batcher, queue, host = bench({"dynamic_batching": {}}, Host(max_batch_bytes=25))
    for rid in ("a", "b", "c"):
        await batcher.admit(queue, pending(rid, size=10))
    queue.free.extend([Slot("w", 0, 0, "exec"), Slot("w", 0, 1, "exec")])
    await batcher.pump(queue)
    assert host.sent == [["a", "b"], ["c"]]


async def test_a_full_queue_refuses_with_tritons_text():
    batcher, queue, host = bench({"dynamic_batching": {"default_queue_policy": {"max_queue_size": 1}}})
    assert await batcher.admit(queue, pending("a"))
    assert not await batcher.admit(queue, pending("b"))
    assert host.failed == {"b": "Exceeds maximum queue size"} and batcher.queued() == 1


async def test_a_queue_timeout_arms_a_timer_and_expired_requests_leave_on_the_sweep():
    batcher, queue, host = bench({"dynamic_batching": {}})
    await batcher.admit(queue, pending("timed", queue_deadline_ns=time.time_ns() + 50_000_000))
    await batcher.admit(queue, pending("gone", deadline_s=-1))
    assert len(host.timers) == 1 and 0 < host.timers[0] <= 0.05
    await batcher.sweep(queue)
    assert host.dropped_ == {"gone": FailReason.REJECTED} and batcher.queued() == 1


async def test_a_request_that_never_ran_goes_back_to_the_head():
    batcher, queue, host = bench({"dynamic_batching": {}})
    await batcher.admit(queue, pending("later"))
    assert batcher.requeue(pending("again"))
    assert [p.header.rid for p in batcher.requests] == ["again", "later"]


async def test_a_cancelled_request_leaves_its_queue_dropped_as_cancelled():
    batcher, queue, host = bench({"dynamic_batching": {}})
    await batcher.admit(queue, pending("a"))
    await batcher.cancel(queue, "a")
    assert host.dropped_ == {"a": FailReason.CANCELED} and batcher.queued() == 0


async def test_a_reload_keeps_the_queue_unless_the_model_becomes_sequence_batched():
    batcher, queue, host = bench({})
    await batcher.admit(queue, pending("a"))
    assert batcher.adopt(spec_from_json({"name": "m", "max_batch_size": 8, "dynamic_batching": {}}))
    assert batcher.policy.dynamic and batcher.queued() == 1
    assert not batcher.adopt(spec_from_json({"name": "m", "max_batch_size": 8, "sequence_batching": {}}))
    await batcher.retire(queue)
    assert host.failed == {"a": "model 'm' is now served by the sequence batcher; send the request again"}


async def test_an_abandoned_version_fails_what_it_queued():
    batcher, queue, host = bench({})
    await batcher.admit(queue, pending("a"))
    await batcher.abandon(queue, "model 'm' version 1 was unloaded")
    assert host.failed == {"a": "model 'm' version 1 was unloaded"} and batcher.queued() == 0

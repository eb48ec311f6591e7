"""How one model version's queue is served, as the pump sees it: one small interface per side.

`Discipline` is what the pump calls; each kind of queue is one object behind it, made for the
version's config by `services/scheduler/discipline_factory.py`:
- `batching/dynamic.py` `DynamicBatcher`: Triton's dynamic batcher, and its default scheduler
  (batches of one: the same queue, priorities and timeouts with `BatchPolicy.dynamic` off);
- `sequences/sequence_batcher.py` `SequenceBatcher`: Triton's sequence batcher (slots, backlog,
  idle timeouts, controls).

`Host` is what a discipline needs back from the pump (`pump.Pump`): credits, the rate limiter,
sending a batch, answering a request, timers. Neither side reaches into the other's attributes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from services.scheduler.batching.formation import Decision
from services.scheduler.records import InFlight, Key, Pending, Slot
from services.scheduler.statistics.reasons import FailReason
from shared.config.model_config import ModelSpec
from shared.wire.messages import RequestHeader, SeqControl

if TYPE_CHECKING:  # the queue holds its discipline: the two types refer to each other
    from services.scheduler.batching.model_queue import ModelQueue


class Discipline(Protocol):
    def adopt(self, spec: ModelSpec) -> bool:
        """The version's new config (a reload): True if this object serves it from now on (what it
        holds carries over), False if another discipline must take its place."""
        ...

    async def retire(self, queue: ModelQueue) -> None:
        """Replaced by another discipline: what it still holds is answered."""
        ...

    async def admit(self, queue: ModelQueue, pending: Pending) -> bool:
        """Queue a request, or answer it at once (refused); True if it was queued."""
        ...

    async def pump(self, queue: ModelQueue) -> None:
        """Send what the queue's free credits can take now; arrange to be back when a batch is due."""
        ...

    async def cancel(self, queue: ModelQueue, rid: str) -> None: ...  # its client went away

    def finished(self, queue: ModelQueue, flight: InFlight) -> None: ...  # a batch of it ended

    async def sweep(self, queue: ModelQueue) -> None:
        """The periodic sweep (`credits.Credits.expire`): requests past their deadline leave even
        when no credit wakes the queue."""
        ...

    async def worker_lost(self, queue: ModelQueue, worker: str, reason: str = "") -> None:
        """The worker died, or retired the instances: what lived on them is lost."""
        ...

    async def abandon(self, queue: ModelQueue, message: str) -> None: ...  # the version is gone: fail all

    def queued(self) -> int: ...  # requests waiting here (not sent yet)

    def requeue(self, pending: Pending) -> bool:
        """A request whose batch never started goes back to the head of the queue; False if the
        discipline never runs a request twice (a sequence's: its state may have moved on)."""
        ...


class Host(Protocol):
    @property
    def max_batch_bytes(self) -> int: ...  # what the requests of one batch may weigh (one bus message)

    def can_run(self, queue: ModelQueue, slot: Slot) -> bool: ...  # the rate limiter lets the instance run

    def take_slot(self, queue: ModelQueue, decision: Decision) -> Slot | None:
        """A free credit for the batch `decision` describes, taken; None if none may run it now."""
        ...

    async def send(
        self,
        queue: ModelQueue,
        slot: Slot,
        batch: list[Pending],
        now: float,
        reason: str,
        controls: list[SeqControl] | None = None,
    ) -> bool:
        """Send a batch on a credit; False (the requests failed, the credit back) if it cannot go."""
        ...

    async def pump(self, queue: ModelQueue) -> None: ...

    async def fail(
        self, queue: ModelQueue, header: RequestHeader, message: str, reason: FailReason = FailReason.OTHER
    ) -> None: ...

    async def dropped(self, queue: ModelQueue, header: RequestHeader, reason: FailReason) -> None: ...

    def waiting(self, key: Key) -> list[InFlight]: ...  # batches sent ahead, not started at their instance

    def after(self, delay_s: float, job: Callable[[], Awaitable[Any]]) -> asyncio.TimerHandle: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...

"""How one model version's queue is served, as the pump sees it: one small interface per side.

`Discipline` (in `model_queue.py`, beside the queue that holds it) is what the pump calls; each
kind of queue is one object behind it, made for the version's config by
`services/scheduler/discipline_factory.py`:
- `batching/dynamic.py` `DynamicBatcher`: Triton's dynamic batcher, and its default scheduler
  (batches of one: the same queue, priorities and timeouts with `BatchPolicy.dynamic` off);
- `sequences/sequence_batcher.py` `SequenceBatcher`: Triton's sequence batcher (slots, backlog,
  idle timeouts, controls).

`Host`, here, is what a discipline needs back from the pump (`pump.Pump`): credits, the rate
limiter, sending a batch, answering a request, timers. Neither side reaches into the other's
attributes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol

from services.scheduler.batching.formation import Decision
from services.scheduler.batching.model_queue import ModelQueue
from services.scheduler.scheduling_records import InFlight, Key, Pending, Slot
from services.scheduler.statistics.reasons import FailReason
from shared.wire.messages import RequestHeader, SeqControl


class Host(Protocol):
    @property
    def max_batch_bytes(self) -> int: ...  # what the requests of one batch may weigh (one bus message)

    def can_run(self, queue: ModelQueue, slot: Slot) -> bool: ...  # the rate limiter lets the instance run

    def take_slot(self, queue: ModelQueue, decision: Decision, route: Sequence[int] = ()) -> Slot | None:
        """A free credit for the batch `decision` describes (whose first request has these prefix
        blocks), taken; None if none may run it now."""
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

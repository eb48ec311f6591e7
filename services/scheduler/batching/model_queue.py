"""One model version's queue as the scheduler keeps it: what every kind of queue shares (its
config, the worker credits free to take a batch, statistics, the release order of answers) and
the discipline that serves it, which holds the requests waiting: `Discipline`, the interface the
pump calls (what a discipline needs back from the pump is `discipline.py`'s `Host`)."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from services.scheduler.batching.ordering import OrderedRelease
from services.scheduler.batching.prefix_router import PrefixRouter
from services.scheduler.batching.queues import Priorities
from services.scheduler.batching.ratelimit import Need
from services.scheduler.scheduling_records import InFlight, Key, Pending, Slot
from services.scheduler.statistics.stats import ModelStats
from shared.config.model_config import ModelSpec


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

    def oldest(self) -> float | None: ...  # when the longest-waiting of them arrived (monotonic); None: none

    def requeue(self, pending: Pending) -> bool:
        """A request whose batch never started goes back to the head of the queue; False if the
        discipline never runs a request twice (a sequence's: its state may have moved on)."""
        ...


@dataclass
class ModelQueue:
    key: Key
    discipline: Discipline  # the dynamic batcher (or default scheduler), or the sequence batcher
    spec: ModelSpec | None = None
    priorities: Priorities = field(default_factory=Priorities)
    needs: list[Need] = field(default_factory=list)  # per instance, for the rate limiter
    free: deque[Slot] = field(default_factory=deque)
    timer: asyncio.TimerHandle | None = None
    stats: ModelStats = field(default_factory=ModelStats)
    ordering: OrderedRelease = field(default_factory=OrderedRelease)  # used with preserve_ordering
    # where requests with prefix blocks went (worker, instance): prefix-aware routing, `pump.take_slot`
    router: PrefixRouter[tuple[str, int]] = field(default_factory=PrefixRouter)

    def need(self, instance: int) -> Need:
        return self.needs[instance] if 0 <= instance < len(self.needs) else Need()

    @property
    def preserve_ordering(self) -> bool:
        return bool(self.spec and self.spec.dynamic_batching and self.spec.dynamic_batching.preserve_ordering)

    @property
    def cache_enabled(self) -> bool:
        return bool(self.spec and self.spec.response_cache)

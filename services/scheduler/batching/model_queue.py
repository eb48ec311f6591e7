"""One model version's queue as the scheduler keeps it: the requests waiting and the worker
credits free to take a batch."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from services.scheduler.batching.formation import BatchPolicy
from services.scheduler.batching.ordering import OrderedRelease
from services.scheduler.batching.queues import Priorities, RequestQueue
from services.scheduler.batching.ratelimit import Need
from services.scheduler.records import Key, Pending, Slot
from services.scheduler.sequences.queue import SequenceQueue
from services.scheduler.statistics.stats import ModelStats
from shared.model_config import ModelSpec


def policy_for(spec: ModelSpec | None) -> BatchPolicy:
    if spec is None or spec.dynamic_batching is None:
        return BatchPolicy(spec.max_batch_size if spec else 0)
    db = spec.dynamic_batching
    return BatchPolicy(spec.max_batch_size, db.preferred_batch_sizes, db.max_queue_delay_us / 1e6, True)


@dataclass
class ModelQueue:
    key: Key
    spec: ModelSpec | None = None
    policy: BatchPolicy = field(default_factory=lambda: BatchPolicy(0))
    requests: RequestQueue[Pending] = field(default_factory=RequestQueue)
    priorities: Priorities = field(default_factory=Priorities)
    needs: list[Need] = field(default_factory=list)  # per instance, for the rate limiter
    free: deque[Slot] = field(default_factory=deque)
    timer: asyncio.TimerHandle | None = None
    stats: ModelStats = field(default_factory=ModelStats)
    ordering: OrderedRelease = field(default_factory=OrderedRelease)  # used with preserve_ordering
    seq: SequenceQueue | None = None  # sequence-batched models: slots, backlog, idle timeouts

    def need(self, instance: int) -> Need:
        return self.needs[instance] if 0 <= instance < len(self.needs) else Need()

    @property
    def pending_count(self) -> int:
        return len(self.requests) + (self.seq.book.queued() if self.seq else 0)

    @property
    def preserve_ordering(self) -> bool:
        return bool(self.spec and self.spec.dynamic_batching and self.spec.dynamic_batching.preserve_ordering)

    @property
    def cache_enabled(self) -> bool:
        return bool(self.spec and self.spec.response_cache)

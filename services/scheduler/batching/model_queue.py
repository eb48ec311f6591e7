"""One model version's queue as the scheduler keeps it: what every kind of queue shares (its
config, the worker credits free to take a batch, statistics, the release order of answers) and
the discipline that serves it (`discipline.py`), which holds the requests waiting."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from services.scheduler.batching.discipline import Discipline
from services.scheduler.batching.ordering import OrderedRelease
from services.scheduler.batching.queues import Priorities
from services.scheduler.batching.ratelimit import Need
from services.scheduler.records import Key, Slot
from services.scheduler.statistics.stats import ModelStats
from shared.config.model_config import ModelSpec


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

    def need(self, instance: int) -> Need:
        return self.needs[instance] if 0 <= instance < len(self.needs) else Need()

    @property
    def preserve_ordering(self) -> bool:
        return bool(self.spec and self.spec.dynamic_batching and self.spec.dynamic_batching.preserve_ordering)

    @property
    def cache_enabled(self) -> bool:
        return bool(self.spec and self.spec.response_cache)

"""One model version's queue as the scheduler keeps it: the requests waiting, the worker
credits free to take a batch, and what a batch in flight remembers."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

import msgspec

from services.scheduler.batching.batcher import BatchPolicy
from services.scheduler.batching.ordering import OrderedRelease
from services.scheduler.batching.queues import Priorities, RequestQueue
from services.scheduler.batching.ratelimit import Need
from services.scheduler.sequences.book import Sequence
from services.scheduler.sequences.queue import SequenceQueue
from services.scheduler.statistics.stats import ModelStats
from shared.model_config import ModelSpec
from shared.wire.messages import RequestHeader

Key = tuple[str, int]  # (model, version)


@dataclass
class Pending:
    header: RequestHeader
    raw: msgspec.Raw  # the request exactly as the gateway encoded it
    arrived: float  # monotonic
    enqueued_ns: int = 0  # CLOCK_MONOTONIC, for traces
    level: int = 0  # priority level (0: the model has one queue)
    queue_deadline_ns: int = 0  # queue policy timeout, wall clock; 0 = none
    sequence: Sequence | None = None  # sequence-batched models: the sequence it belongs to
    retried: bool = False  # sent again once after its worker died (never twice: it may be what kills them)

    @property
    def batch_size(self) -> int:
        return self.header.batch_size

    @property
    def expires_ns(self) -> int:
        if self.queue_deadline_ns:
            return min(self.header.deadline_ns, self.queue_deadline_ns)
        return self.header.deadline_ns

    @property
    def shape_sig(self) -> str:
        return self.header.shape_sig


@dataclass(frozen=True)
class Slot:
    """One credit of one instance: the right to send it one batch."""

    worker: str
    instance: int
    credit: int
    subject: str
    generation: int = 0


@dataclass
class InFlight:
    key: Key
    slot: Slot
    requests: list[Pending]
    dispatched: float
    cancelled: set[str] = field(default_factory=set)  # rids whose client left while the batch waited

    def holds(self, rid: str) -> bool:
        return any(p.header.rid == rid for p in self.requests)

    @property
    def live(self) -> list[Pending]:
        """Its requests still owed an answer: a cancelled one was answered (counted) already."""
        return [p for p in self.requests if p.header.rid not in self.cancelled]


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

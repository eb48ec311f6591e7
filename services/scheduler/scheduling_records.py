"""The records the scheduler's parts hand each other: a queued request (`Pending`), a worker
credit (`Slot`), a batch in flight (`InFlight`) and a live sequence (`Sequence`).

A leaf: it imports nothing of the scheduler, so batching, the sequence batcher, the completion
path and the hand-over can all use these types without importing each other.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import msgspec

from shared.wire.messages import RequestHeader

Key = tuple[str, int]  # (model, version)
SlotKey = tuple[str, int, int]  # (worker, instance, slot index)
CorrId = int | str


@dataclass(eq=False)  # identity: two sequences are never the same one
class Sequence:
    corrid: CorrId
    seq: int  # unique per sequence: a reused correlation id is another sequence
    slot: SlotKey | None = None  # None: in the backlog
    queue: deque[Any] = field(default_factory=deque)  # requests waiting (scheduler `Pending`s)
    running: Any = None  # the request executing now, if any
    closing: bool = False  # its END arrived: no more requests join it
    ran: bool = False  # one of its requests was sent to run (its START reached the worker)
    active_at: float = 0.0  # monotonic: last arrival, dispatch, completion or slot grant

    @property
    def instance(self) -> tuple[str, int] | None:
        return None if self.slot is None else (self.slot[0], self.slot[1])

    @property
    def ready(self) -> bool:
        """Has a request to run and nothing running: may take part in the next batch."""
        return self.slot is not None and self.running is None and bool(self.queue)


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
    local: str = ""  # the worker's local channel (`InstanceFree.local`)


@dataclass
class InFlight:
    key: Key
    slot: Slot
    requests: list[Pending]
    dispatched: float
    over_bus: bool = True  # sent over NATS, not on the worker's local channel
    cancelled: set[str] = field(default_factory=set)  # rids whose client left while the batch waited
    rescheduled: set[str] = field(default_factory=set)  # rids the model released to run again
    # OpenTelemetry: the batch's span, ended with it (batching/batch_spans.py). Any, not object: a compiled
    # dataclass (shoal/compiled_modules.py) cannot resolve a field annotated `object` (mypyc raises KeyError at import)
    span: Any = None

    def holds(self, rid: str) -> bool:
        return any(p.header.rid == rid for p in self.requests)

    @property
    def live(self) -> list[Pending]:
        """Its requests still owed an answer: a cancelled one was answered (counted) already."""
        return [p for p in self.requests if p.header.rid not in self.cancelled]

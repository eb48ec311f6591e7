"""A model's request queue with Triton's priority levels and queue policies (docs/triton-spec.md §3.3).

Levels are served highest first (1 is the highest), FIFO within a level. Each level has
a `ModelQueuePolicy`: `max_queue_size` refuses requests at arrival; a request waiting past
its queue timeout is rejected (REJECT) or moved behind the level's other requests (DELAY).
The batcher reads the queue in serving order: `queue[0]`, iteration, `popleft()`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar


class Queued(Protocol):
    level: int
    queue_deadline_ns: int  # 0 = no queue timeout

    @property
    def expires_ns(self) -> int:
        """When it must leave the queue at the latest (its deadline, or its queue timeout)."""
        ...


_NEVER = 1 << 63


class TimeoutAction(StrEnum):
    REJECT = "REJECT"
    DELAY = "DELAY"


T = TypeVar("T", bound=Queued)


@dataclass(frozen=True)
class QueuePolicy:
    timeout_action: str = TimeoutAction.REJECT
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    @classmethod
    def from_json(cls, doc: dict[str, Any] | None) -> QueuePolicy:
        doc = doc or {}
        return cls(
            timeout_action=doc.get("timeout_action", TimeoutAction.REJECT),
            default_timeout_us=int(doc.get("default_timeout_microseconds", 0)),
            allow_timeout_override=bool(doc.get("allow_timeout_override", False)),
            max_queue_size=int(doc.get("max_queue_size", 0)),
        )

    def timeout_us(self, requested_us: int) -> int:
        """Triton honours a request's `timeout` only to shorten the default, and only if allowed."""
        if (
            self.allow_timeout_override
            and 0 < requested_us
            and (self.default_timeout_us == 0 or requested_us < self.default_timeout_us)
        ):
            return requested_us
        return self.default_timeout_us


@dataclass(frozen=True)
class Priorities:
    levels: int = 0  # 0: one queue
    default_level: int = 0
    default_policy: QueuePolicy = QueuePolicy()
    policies: dict[int, QueuePolicy] = field(default_factory=dict)

    @classmethod
    def from_json(cls, batching: dict[str, Any] | None) -> Priorities:
        batching = batching or {}
        return cls(
            levels=int(batching.get("priority_levels", 0)),
            default_level=int(batching.get("default_priority_level", 0)),
            default_policy=QueuePolicy.from_json(batching.get("default_queue_policy")),
            policies={int(k): QueuePolicy.from_json(v) for k, v in batching.get("priority_queue_policy", {}).items()},
        )

    def level(self, priority: int) -> int:
        if self.levels == 0:
            return 0
        return priority if 1 <= priority <= self.levels else self.default_level

    def policy(self, level: int) -> QueuePolicy:
        return self.policies.get(level, self.default_policy)


class RequestQueue(Generic[T]):
    def __init__(self) -> None:
        self._levels: dict[int, deque[T]] = {}
        self._delayed: dict[int, deque[T]] = {}
        self._parts: list[deque[T]] = []  # serving order; rebuilt only when the deques change
        # No request expires before this (a watermark: requests taken out leave it early, never late),
        # so the scheduler's check for expired requests is O(1) until one may have.
        self._earliest_ns = _NEVER

    def earliest_expiry_ns(self) -> int | None:
        """When the first request may reach its deadline or queue timeout (wall-clock ns; never
        later than the truth, maybe earlier), or None with nothing that expires."""
        return None if self._earliest_ns == _NEVER else self._earliest_ns

    def due(self, now_ns: int) -> bool:
        """Whether some request may have reached its deadline or queue timeout by `now_ns`."""
        return self._earliest_ns <= now_ns

    def _reorder(self) -> None:
        self._parts = []
        for level in sorted(set(self._levels) | set(self._delayed)):
            self._parts.append(self._levels.setdefault(level, deque()))
            self._parts.append(self._delayed.setdefault(level, deque()))

    def __iter__(self) -> Iterator[T]:
        for part in self._parts:
            yield from part

    def __len__(self) -> int:
        return sum(len(part) for part in self._parts)

    def __bool__(self) -> bool:
        return any(self._parts)

    def __getitem__(self, index: int) -> T:
        if index != 0:
            raise IndexError("only the head of the queue can be read")
        for part in self._parts:
            if part:
                return part[0]
        raise IndexError("empty queue")

    def popleft(self) -> T:
        for part in self._parts:
            if part:
                return part.popleft()
        raise IndexError("empty queue")

    def append(self, item: T) -> None:
        self._level_of(item).append(item)

    def appendleft(self, item: T) -> None:
        """Back to the head of its level (a retried request keeps its place in line)."""
        self._level_of(item).appendleft(item)

    def _level_of(self, item: T) -> deque[T]:
        """The deque `item` joins (made on first use), with the expiry watermark lowered for it."""
        part = self._levels.get(item.level)
        if part is None:
            self._levels[item.level] = part = deque()
            self._reorder()
        self._earliest_ns = min(self._earliest_ns, item.expires_ns)
        return part

    def size(self, level: int) -> int:
        return len(self._levels.get(level, ())) + len(self._delayed.get(level, ()))

    def remove(self, predicate: Callable[[T], bool]) -> list[T]:
        """Take out every request `predicate` selects (cancelled, past its deadline)."""
        removed: list[T] = []
        for queues in (self._levels, self._delayed):
            for level, part in queues.items():
                kept: deque[T] = deque()
                for item in part:
                    (removed if predicate(item) else kept).append(item)
                queues[level] = kept
        self._reorder()
        self._rescan()
        return removed

    def time_out(self, now_ns: int, priorities: Priorities) -> list[T]:
        """Apply queue timeouts: REJECT returns them to be failed, DELAY moves them back."""
        rejected: list[T] = []
        for level, part in self._levels.items():
            expired = [i for i in part if i.queue_deadline_ns and i.queue_deadline_ns <= now_ns]
            if not expired:
                continue
            self._levels[level] = deque(i for i in part if not (i.queue_deadline_ns and i.queue_deadline_ns <= now_ns))
            if priorities.policy(level).timeout_action == TimeoutAction.DELAY:
                for item in expired:
                    item.queue_deadline_ns = 0  # delayed once, then served in turn
                self._delayed.setdefault(level, deque()).extend(expired)
            else:
                rejected.extend(expired)
        self._reorder()
        self._rescan()
        return rejected

    def _rescan(self) -> None:
        self._earliest_ns = min((item.expires_ns for part in self._parts for item in part), default=_NEVER)

"""Dynamic batch formation with Triton's rules (docs/triton-spec.md §3.3), as pure logic.

`next_batch` looks at the queue when an instance is free and says how many requests
to send now, or until when to wait for a better batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


class Queued(Protocol):
    @property
    def batch_size(self) -> int: ...
    @property
    def shape_sig(self) -> str: ...
    @property
    def arrived(self) -> float: ...  # monotonic seconds


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int  # 0 = the model does not batch
    preferred: tuple[int, ...] = ()  # sorted; empty = (max_batch_size,)
    max_queue_delay_s: float = 0.0
    dynamic: bool = False  # False = default scheduler: one request per execution

    @property
    def largest_preferred(self) -> int:
        return self.preferred[-1] if self.preferred else self.max_batch_size


@dataclass(frozen=True)
class Decision:
    take: int  # requests to send now (0 = wait)
    reason: str = ""
    wake_at: float | None = None  # when to look again if waiting
    # the batch cannot grow: requests arriving later, and time passing, would not change it
    complete: bool = False


def next_batch(queue: Iterable[Queued], policy: BatchPolicy, now: float) -> Decision:
    """`queue` in serving order (only its head matters unless the model batches dynamically)."""
    requests = iter(queue)
    head = next(requests, None)
    if head is None:
        return Decision(0)
    if not policy.dynamic or policy.max_batch_size <= 1:
        return Decision(1, "default scheduler", complete=True)
    preferred = set(policy.preferred or (policy.max_batch_size,))
    total = count = preferred_count = 0
    can_grow = True
    shape_sig = head.shape_sig
    reason = ""
    for request in itertools.chain((head,), requests):
        size = max(1, request.batch_size)
        if request.shape_sig != shape_sig:
            can_grow, reason = False, "shape mismatch"
            break
        if total + size > policy.max_batch_size:
            can_grow, reason = False, "max batch size"
            break
        total += size
        count += 1
        if total in preferred:
            preferred_count = count
        if total >= policy.largest_preferred:
            can_grow, reason = False, "preferred batch size"
            break
    oldest = head.arrived
    expired = policy.max_queue_delay_s <= 0 or now - oldest >= policy.max_queue_delay_s
    if not can_grow:
        return Decision(count, reason, complete=True)
    if expired:
        return Decision(count, "queue delay expired" if policy.max_queue_delay_s > 0 else "no queue delay")
    if preferred_count:
        return Decision(preferred_count, "preferred batch size")
    return Decision(0, "waiting", oldest + policy.max_queue_delay_s)

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
    """`queue` in serving order (only its head matters unless the model batches dynamically).

    Triton's `DynamicBatchScheduler::GetDynamicBatch` (core): requests join the pending batch in
    order while it fits the max batch size and the head's shapes. The best batch is the last one
    whose size is preferred or, once a request would take the batch past the largest preferred
    size, the batch before that request (it is "saturated"). Within the queue delay the best batch
    goes at once; past it, everything pending goes. So with preferred sizes [2, 6] a batch of 3
    followed by a 4 sends the 3 at once (3 + 4 passes 6), and the 4 waits its own full delay
    (issue 28 item 9).
    """
    requests = iter(queue)
    head = next(requests, None)
    if head is None:
        return Decision(0)
    if not policy.dynamic or policy.max_batch_size <= 1:
        return Decision(1, "default scheduler", complete=True)
    preferred = set(policy.preferred or (policy.max_batch_size,))
    largest = policy.largest_preferred
    total = count = best = best_total = 0
    saturated = send_now = False
    reason = ""
    for request in itertools.chain((head,), requests):
        size = max(1, request.batch_size)
        if count:
            if total + size > largest and not best:
                best, best_total, saturated = count, total, True
            if total + size > policy.max_batch_size:
                send_now, reason = True, "max batch size"
                break
            if request.shape_sig != head.shape_sig:
                send_now, reason = True, "shape mismatch"
                break
        total += size
        count += 1
        if total in preferred:
            best, best_total = count, total
    delay = policy.max_queue_delay_s
    expired = delay > 0 and now - head.arrived >= delay
    # complete: nothing arriving later, and no delay expiring, changes the batch. Past the delay
    # everything pending goes, so a batch with a delay is complete only once nothing can join it.
    full = send_now or total >= policy.max_batch_size
    if best and not expired:
        complete = (saturated or best_total >= largest) if delay <= 0 else (best == count and full)
        return Decision(best, "preferred batch size", complete=complete)
    if send_now or total >= largest:
        return Decision(count, reason or "preferred batch size", complete=full)
    if expired or delay <= 0:
        return Decision(count, "queue delay expired" if delay > 0 else "no queue delay")
    return Decision(0, "waiting", head.arrived + delay)

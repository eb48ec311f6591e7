"""When a batch may go to an instance that is still running one (docs/scheduling.md).

A worker grants two credits per instance, so the next batch can wait at the worker instead of
a bus round trip after each batch. Triton forms a batch only when an instance is free
(docs/triton-spec.md §3.3): a batch formed earlier, while the instance still runs, must be the batch
Triton would form when it frees, or priorities, queue policies and batch formation change. It
is when nothing that can happen in between could change it:

- one priority level (a later request of a higher level would go first),
- no queue policy: no timeout (a request could time out, or be delayed, while it waits) and no
  `max_queue_size` (a request taken early would no longer count against it),
- no rate limiter (it decides which instance runs when resources free),
- and either no dynamic batcher (Triton's default scheduler: batches of one, first come first
  served) or a batch that cannot grow (full, at its largest preferred size, or stopped by a
  request of another shape): later arrivals queue behind it and would not join it.

Otherwise only an instance with nothing running gets a batch. The sequence batcher keeps its
own rules (a sequence has one request running at a time whatever the credits).
"""

from __future__ import annotations

from services.scheduler.batching.formation import Decision
from services.scheduler.batching.queues import Priorities, QueuePolicy


def _queue_policy(policy: QueuePolicy) -> bool:
    return bool(policy.default_timeout_us or policy.allow_timeout_override or policy.max_queue_size)


def may_prefetch(priorities: Priorities, rate_limited: bool, decision: Decision) -> bool:
    """Whether the batch `decision` describes may be sent to an instance still running one
    (`next_batch` marks the default scheduler's batches of one complete)."""
    policies = [priorities.default_policy, *priorities.policies.values()]
    if rate_limited or priorities.levels > 1 or any(_queue_policy(p) for p in policies):
        return False
    return decision.complete

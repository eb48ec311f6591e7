"""Which ready sequences of one instance run together now (docs/triton-spec.md §3.4), as pure logic.

direct: one request per ready slot; with `minimum_slot_utilization` and
`max_queue_delay_microseconds` it waits (at most the delay, from the oldest head's arrival)
until that share of the instance's slots is ready.
oldest: the ready sequences' head requests are batched with the dynamic batcher's rules
(preferred sizes, delay), oldest first; one request per sequence per batch by construction.

Both only batch requests whose variable input shapes match (the worker concatenates them).
The scheduler only chooses requests; for direct the worker places each in the batch row of
its slot (`SeqControl.slot`) and pads the gaps with not-ready rows, as Triton does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from services.scheduler.batching.formation import BatchPolicy, next_batch
from services.scheduler.scheduling_records import Sequence
from shared.config.sequence_config import SequenceConfig


@dataclass(frozen=True)
class SequenceDecision:
    take: list[Sequence]  # run the head request of each now; empty = wait
    reason: str = ""
    wake_at: float | None = None


def decide(config: SequenceConfig, ready: list[Sequence], now: float) -> SequenceDecision:
    if not ready:
        return SequenceDecision([])
    ready = sorted(ready, key=lambda s: s.queue[0].arrived)
    if config.strategy == "oldest":
        policy = BatchPolicy(
            config.max_batch_size,
            config.preferred_batch_sizes or (max(1, config.max_batch_size),),
            config.max_queue_delay_us / 1e6,
            True,
        )
        decision = next_batch(deque(s.queue[0] for s in ready), policy, now)
        return SequenceDecision(ready[: decision.take], decision.reason, decision.wake_at)
    shape = ready[0].queue[0].shape_sig
    take = [s for s in ready if s.queue[0].shape_sig == shape][: max(1, config.max_batch_size)]
    slots = config.slots_per_instance
    if config.minimum_slot_utilization > 0 and config.max_queue_delay_us > 0 and len(take) < slots:
        wake_at = ready[0].queue[0].arrived + config.max_queue_delay_us / 1e6
        if len(take) / slots < config.minimum_slot_utilization and now < wake_at:
            return SequenceDecision([], "waiting for slot utilization", wake_at)
        return SequenceDecision(take, "queue delay expired" if now >= wake_at else "slot utilization reached")
    return SequenceDecision(take, "sequence slots ready")

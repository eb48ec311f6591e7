"""Model Analyzer's quick search as a hill climb over the candidate space (pure: no I/O).

Start from the model's own configuration; its neighbours grow one coordinate each (one more instance,
twice the max batch size, dynamic batching switched on, a longer queue delay, the max batch preferred);
move to the best neighbour while it raises the score by at least `min_gain`, stop when none does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shoal.analyze.configs import Candidate

QUEUE_DELAYS_US = (0, 100, 500, 1000, 2000, 5000, 10000)


@dataclass(frozen=True)
class Limits:
    max_instances: int = 5
    max_batch_size: int = 128


def neighbours(c: Candidate, limits: Limits) -> list[Candidate]:
    """The next candidates from c, most promising first (instances, then batch sizes, then batching knobs)."""
    out = []
    if c.instances < limits.max_instances:
        out.append(replace(c, instances=c.instances + 1))
    if c.max_batch_size == 0:  # a model without batching: only instances can grow
        return out
    if c.max_batch_size * 2 <= limits.max_batch_size:
        bigger = c.max_batch_size * 2
        preferred = tuple(bigger if b == c.max_batch_size else b for b in c.preferred_batch_size)
        out.append(replace(c, max_batch_size=bigger, preferred_batch_size=preferred))
    if not c.dynamic_batching:
        out.append(replace(c, dynamic_batching=True, max_queue_delay_us=0))
        return out
    longer = [d for d in QUEUE_DELAYS_US if d > c.max_queue_delay_us]
    if longer:
        out.append(replace(c, max_queue_delay_us=longer[0]))
    if c.preferred_batch_size != (c.max_batch_size,):
        out.append(replace(c, preferred_batch_size=(c.max_batch_size,)))
    return out


class QuickSearch:
    """Asks for candidates one at a time; `record` tells it each one's score (None: it failed to load)."""

    def __init__(self, start: Candidate, limits: Limits, min_gain: float = 0.02) -> None:
        self.limits, self.min_gain = limits, min_gain
        self.scores: dict[Candidate, float | None] = {}
        self.current = start
        self.queue: list[Candidate] = [start]

    def next(self) -> Candidate | None:
        while True:
            while self.queue:
                candidate = self.queue.pop(0)
                if candidate not in self.scores:
                    return candidate
            if not self._climb():
                return None

    def record(self, candidate: Candidate, score: float | None) -> None:
        self.scores[candidate] = score

    def best(self) -> tuple[Candidate, float] | None:
        scored = [(c, s) for c, s in self.scores.items() if s is not None]
        return max(scored, key=lambda cs: cs[1]) if scored else None

    def _climb(self) -> bool:
        """Move to the best measured neighbour if it gains enough; queue its neighbours."""
        here = self.scores.get(self.current) or 0.0
        around = [n for n in neighbours(self.current, self.limits) if self.scores.get(n) is not None]
        if self.current in self.scores and around:
            top = max(around, key=lambda n: self.scores[n] or 0.0)
            if (self.scores[top] or 0.0) > here * (1 + self.min_gain):
                self.current = top
                self.queue = [n for n in neighbours(top, self.limits) if n not in self.scores]
                return True
            return False
        self.queue = [n for n in neighbours(self.current, self.limits) if n not in self.scores]
        return bool(self.queue)

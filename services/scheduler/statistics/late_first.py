"""First responses that come after their request's completion.

A decoupled model may send its first response after `execute` returned: from a thread it
started, or an engine's loop (shoal/llm/python_model.py). The completion then says nothing of
it, and the worker sends the time later, to every scheduler (a `FirstResponse`). Only the
replica that completed the request waits for it, so each request is observed once however many
replicas run. The two messages travel separately (the completion may take the local channel or
a co-hosting gateway), so a time may also come first and wait, briefly, for its completion.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from services.scheduler.statistics.stats import ModelStats

WAIT_S = 600.0  # how long a completed request waits for its first response (an LLM's prefill, queued)
EARLY_S = 10.0  # how long a first response waits for its completion (ms apart in practice); others' too


class LateFirstResponses:
    def __init__(self) -> None:
        # rid -> (the model's statistics, when the request arrived, until when it waits); oldest first
        self.waiting: OrderedDict[str, tuple[ModelStats, int, float]] = OrderedDict()
        self.early: OrderedDict[str, tuple[int, float]] = OrderedDict()  # rid -> (sent, until when)

    def expect(self, rid: str, stats: ModelStats, received_ns: int) -> None:
        """Request `rid` completed without a first response: observe it when it comes."""
        now = time.monotonic()
        self._expire(now)
        early = self.early.pop(rid, None)
        if early is not None:
            stats.latencies.first_response(early[0] - received_ns)
            return
        self.waiting[rid] = (stats, received_ns, now + WAIT_S)

    def arrived(self, rid: str, sent_ns: int) -> None:
        """A worker says when request `rid` had its first response: ours, or another replica's."""
        now = time.monotonic()
        self._expire(now)
        waiting = self.waiting.pop(rid, None)
        if waiting is not None:
            stats, received_ns, _ = waiting
            stats.latencies.first_response(sent_ns - received_ns)
            return
        self.early[rid] = (sent_ns, now + EARLY_S)

    def _expire(self, now: float) -> None:
        """Entries are kept oldest first with one lifetime per map: the expired ones lead."""
        while self.waiting and next(iter(self.waiting.values()))[2] < now:
            self.waiting.popitem(last=False)
        while self.early and next(iter(self.early.values()))[1] < now:
            self.early.popitem(last=False)

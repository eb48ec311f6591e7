"""Latency distributions for the metrics Triton offers behind `--metrics-config`:
summaries (quantiles over recent requests) and the first-response histogram."""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from shared.config.metric_config import FIRST_RESPONSE_BUCKETS_MS
from shared.wire.statistics import Latency

WINDOW = 2048  # recent samples a summary's quantiles are computed over
KINDS = ("request", "queue", "compute_input", "compute_infer", "compute_output")
NS_PER_MS = 1_000_000


@dataclass
class Latencies:
    recent: dict[str, deque[float]] = field(default_factory=lambda: {k: deque(maxlen=WINDOW) for k in KINDS})
    buckets: tuple[float, ...] = FIRST_RESPONSE_BUCKETS_MS  # the model's first-response bounds, ms
    first_response_counts: list[int] = field(default_factory=lambda: [0] * (len(FIRST_RESPONSE_BUCKETS_MS) + 1))
    first_response_sum_ms: float = 0.0

    def add(self, kind: str, ns: int, count: int = 1) -> None:
        """`count` samples of `ns` (each request of a batch is charged the batch's compute time)."""
        recent = self.recent[kind]
        if count == 1:
            recent.append(ns / 1000)  # microseconds, as Triton's *_summary_us
        else:
            recent.extend(itertools.repeat(ns / 1000, count))

    def first_response(self, ns: int) -> None:
        """A request's time to its first response. In whole milliseconds, as Triton's core divides
        integer nanoseconds: its `_sum` stays an integer (L0_metrics parses it with `int()`)."""
        ms = float(max(0, ns) // NS_PER_MS)
        self.first_response_sum_ms += ms
        self.first_response_counts[bisect.bisect_left(self.buckets, ms)] += 1  # le: a bound holds its equal

    def use_buckets(self, buckets: tuple[float, ...]) -> None:
        """The model's (new) config's bounds (`model_metrics`); changed ones start the histogram
        afresh, as Triton's does when the model is loaded again."""
        if buckets != self.buckets:
            self.buckets = buckets
            self.first_response_counts = [0] * (len(buckets) + 1)
            self.first_response_sum_ms = 0.0

    def report(self, quantiles: list[float]) -> Latency:
        """The `quantiles` of each kind's recent samples and the first-response histogram."""
        summaries = {}
        for kind, values in self.recent.items():
            points = np.quantile(np.fromiter(values, float), quantiles).tolist() if values and quantiles else []
            summaries[kind] = {str(q): v for q, v in zip(quantiles, points)}
        return Latency(summaries, list(self.buckets), list(self.first_response_counts), self.first_response_sum_ms)

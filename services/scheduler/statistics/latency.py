"""Latency distributions for the metrics Triton offers behind `--metrics-config`:
summaries (quantiles over recent requests) and the first-response histogram."""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from shared.wire.statistics import Latency

WINDOW = 2048  # recent samples a summary's quantiles are computed over
FIRST_RESPONSE_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)  # Triton's defaults
KINDS = ("request", "queue", "compute_input", "compute_infer", "compute_output")


@dataclass
class Latencies:
    recent: dict[str, deque[float]] = field(default_factory=lambda: {k: deque(maxlen=WINDOW) for k in KINDS})
    first_response: list[int] = field(default_factory=lambda: [0] * (len(FIRST_RESPONSE_BUCKETS_MS) + 1))
    first_response_sum_ms: float = 0.0

    def add(self, kind: str, ns: int, count: int = 1) -> None:
        """`count` samples of `ns` (each request of a batch is charged the batch's compute time)."""
        recent = self.recent[kind]
        if count == 1:
            recent.append(ns / 1000)  # microseconds, as Triton's *_summary_us
        else:
            recent.extend(itertools.repeat(ns / 1000, count))
        if kind == "request":
            ms = ns / 1e6
            self.first_response_sum_ms += ms * count
            self.first_response[bisect.bisect_left(FIRST_RESPONSE_BUCKETS_MS, ms)] += count

    def report(self, quantiles: list[float]) -> Latency:
        """The `quantiles` of each kind's recent samples and the first-response histogram."""
        summaries = {}
        for kind, values in self.recent.items():
            points = np.quantile(np.fromiter(values, float), quantiles).tolist() if values and quantiles else []
            summaries[kind] = {str(q): v for q, v in zip(quantiles, points)}
        return Latency(
            summaries, list(FIRST_RESPONSE_BUCKETS_MS), list(self.first_response), self.first_response_sum_ms
        )

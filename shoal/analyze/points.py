"""Measured points: a candidate at one concurrency. Scores under a latency budget and the Pareto front (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shoal.analyze.configs import Candidate
from shoal.perf.measure import LevelResult


@dataclass(frozen=True)
class Point:
    candidate: Candidate
    result: LevelResult

    @property
    def throughput(self) -> float:
        return self.result.client.throughput

    @property
    def p99_ms(self) -> float:
        return self.result.client.percentiles_us[99] / 1e3


def within(point: Point, budget_ms: float | None) -> bool:
    return budget_ms is None or point.p99_ms <= budget_ms


def score(points: Sequence[Point], budget_ms: float | None) -> float:
    """A candidate's score: its best throughput at a p99 latency within the budget (0 when none is)."""
    return max((p.throughput for p in points if within(p, budget_ms)), default=0.0)


def best_point(points: Sequence[Point], budget_ms: float | None) -> Point | None:
    fitting = [p for p in points if within(p, budget_ms)]
    return max(fitting, key=lambda p: p.throughput) if fitting else None


def pareto_front(points: Sequence[Point]) -> list[Point]:
    """Points no other point beats on both throughput (higher) and p99 latency (lower), by latency."""
    front: list[Point] = []
    for p in sorted(points, key=lambda p: (p.p99_ms, -p.throughput)):
        if not front or p.throughput > front[-1].throughput:
            front.append(p)
    return front

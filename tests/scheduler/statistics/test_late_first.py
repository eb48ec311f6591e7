"""services/scheduler/statistics/late_first.py: a first response after its request's completion is
observed once, by the replica that completed the request, in either order of the two messages."""

from __future__ import annotations

from services.scheduler.statistics import late_first
from services.scheduler.statistics.late_first import LateFirstResponses
from services.scheduler.statistics.stats import ModelStats

MS = 1_000_000


def _observed(stats: ModelStats) -> tuple[int, float]:
    return sum(stats.latencies.first_response_counts), stats.latencies.first_response_sum_ms


def test_a_time_after_the_completion_is_observed_once():
    stats, late = ModelStats(), LateFirstResponses()
    late.expect("r1", stats, received_ns=1_000 * MS)
    late.arrived("r1", 1_250 * MS)
    late.arrived("r1", 1_300 * MS)  # not ours any more: kept briefly, never observed
    assert _observed(stats) == (1, 250.0)


def test_a_time_before_the_completion_waits_for_it():
    stats, late = ModelStats(), LateFirstResponses()
    late.arrived("r1", 1_120 * MS)
    late.expect("r1", stats, received_ns=1_000 * MS)
    assert _observed(stats) == (1, 120.0) and not late.early and not late.waiting


def test_another_replicas_request_is_not_observed_and_is_forgotten(monkeypatch):
    stats, late = ModelStats(), LateFirstResponses()
    late.arrived("theirs", 5 * MS)
    late.expect("mine", stats, received_ns=0)
    assert _observed(stats) == (0, 0.0) and set(late.early) == {"theirs"}
    clock = late_first.time.monotonic() + late_first.WAIT_S + 1
    monkeypatch.setattr(late_first.time, "monotonic", lambda: clock)
    late.arrived("mine", 7 * MS)  # too late even for us: both entries expired first
    assert _observed(stats) == (0, 0.0) and set(late.early) == {"mine"} and not late.waiting

from __future__ import annotations

from shoal.analyze.configs import Candidate
from shoal.analyze.points import Point, pareto_front, score
from shoal.perf.measure import ClientStats, LevelResult, ServerStats


def point(throughput: float, p99_ms: float, name: int = 1) -> Point:
    client = ClientStats(1, 1.0, throughput, p99_ms * 500, {50: 0, 90: 0, 95: 0, 99: p99_ms * 1e3})
    return Point(Candidate(name, 8, True), LevelResult("concurrency", 1, client, ServerStats(), True, 3))


def test_score_is_the_best_throughput_within_the_budget():
    points = [point(100, 5), point(300, 20), point(200, 9)]
    assert score(points, None) == 300
    assert score(points, 10) == 200
    assert score(points, 1) == 0.0


def test_pareto_front_keeps_only_undominated_points():
    a, b, c, d = point(100, 5), point(300, 20), point(200, 9), point(150, 12)
    assert pareto_front([a, b, c, d]) == [a, c, b]

"""services/scheduler/statistics/latency.py and stats.py: the time-to-first-response histogram
as Triton's core keeps it: whole milliseconds, `le` bounds, one observation per answered request."""

from __future__ import annotations

from services.scheduler.statistics.latency import Latencies
from services.scheduler.statistics.reasons import FailReason
from services.scheduler.statistics.stats import ModelStats

MS = 1_000_000


def test_observations_are_whole_milliseconds_in_le_buckets():
    latencies = Latencies()
    for ns in (100 * MS, 100 * MS + 999_999, 101 * MS, 7000 * MS, -5):
        latencies.first_response(ns)
    report = latencies.report([])
    assert report.first_response_buckets == [100, 500, 2000, 5000]
    # 100.999 ms is 100 (integer division, as Triton's), and a bound holds its equal
    assert report.first_response_counts == [3, 1, 0, 0, 1]
    assert report.first_response_sum_ms == 100 + 100 + 101 + 7000 + 0


def test_a_models_own_buckets_start_the_histogram_afresh():
    latencies = Latencies()
    latencies.first_response(3 * MS)
    latencies.use_buckets((100.0, 500.0, 2000.0, 5000.0))  # the same: kept
    assert latencies.first_response_counts == [1, 0, 0, 0, 0]
    latencies.use_buckets((-1.0, 0.0, 1.0, 2.5))
    assert (latencies.first_response_counts, latencies.first_response_sum_ms) == ([0] * 5, 0.0)
    latencies.first_response(2 * MS)
    assert latencies.report([]).first_response_counts == [0, 0, 0, 1, 0]


def test_a_request_is_observed_at_its_first_response_or_else_its_end():
    stats = ModelStats()
    stats.record_request(True, 900 * MS)  # one response: its end
    stats.record_request(True, 3000 * MS, first_response_ns=50 * MS)  # decoupled: streamed early
    stats.record_request(False, 10 * MS, FailReason.REJECTED)  # answered with an error: observed
    stats.record_request(False, 10 * MS, FailReason.CANCELED, responded=False)  # nobody answered
    latencies = stats.latencies
    assert latencies.first_response_counts == [2, 0, 1, 0, 0]
    assert latencies.first_response_sum_ms == 900 + 50 + 10
    assert (stats.success.count, stats.fail.count) == (2, 2)

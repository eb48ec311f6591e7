"""services/scheduler/statistics/stats.py: an execution charges each of its requests the batch's
compute times (Triton's `inference_stats`), and the batch itself once (`batch_stats`)."""

from __future__ import annotations

from services.scheduler.statistics.stats import ModelStats


def test_a_batch_charges_each_request_and_counts_once_per_batch_size():
    stats = ModelStats()
    stats.record_batch(batch_size=4, requests=3, input_ns=10, infer_ns=100, output_ns=-5)
    stats.record_batch(batch_size=4, requests=1, input_ns=20, infer_ns=200, output_ns=7)
    assert (stats.execution_count, stats.inference_count) == (2, 8)
    assert (stats.compute_input.count, stats.compute_input.ns) == (4, 3 * 10 + 20)
    assert (stats.compute_infer.count, stats.compute_infer.ns) == (4, 3 * 100 + 200)
    assert (stats.compute_output.count, stats.compute_output.ns) == (4, 7)  # a negative time counts as 0
    batch = stats.batches[4]
    assert (batch.compute_infer.count, batch.compute_infer.ns) == (2, 300)
    assert list(stats.latencies.recent["compute_infer"]) == [0.1, 0.1, 0.1, 0.2]

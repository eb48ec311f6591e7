from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shoal.perf.measure import ClientStats, Record, client_stats, is_stable, percentile_of, server_delta


@given(st.lists(st.integers(0, 10**9), min_size=1), st.floats(0.1, 100))
def test_percentile_is_a_sample_with_at_least_p_percent_at_or_below_it(values, p):
    ordered = sorted(values)
    value = percentile_of(ordered, p)
    assert value in ordered
    assert sum(v <= value for v in ordered) >= p / 100 * len(ordered)


def test_client_stats_counts_inferences_by_batch_and_reports_microseconds():
    records = [Record(0, 1_000_000, 10_000, 20_000), Record(0, 3_000_000, 30_000, 40_000)]
    stats = client_stats(records, 2_000_000_000, batch_size=4)
    assert stats.requests == 2
    assert stats.throughput == 4.0  # 2 requests x 4 inferences in 2 s
    assert stats.avg_us == 2000.0
    assert stats.percentiles_us[50] == 1000.0 and stats.percentiles_us[99] == 3000.0
    assert (stats.send_us, stats.recv_us) == (20.0, 30.0)


def window(throughput: float, latency: float) -> ClientStats:
    return ClientStats(10, 1.0, throughput, latency, {99: latency * 2})


def test_stable_needs_three_windows_within_the_percentage_of_their_mean():
    assert not is_stable([window(100, 10), window(100, 10)], 10)
    assert is_stable([window(50, 99), window(100, 10), window(95, 10.5), window(105, 9.6)], 10)
    assert not is_stable([window(100, 10), window(100, 10), window(130, 10)], 10)
    assert not is_stable([window(100, 10), window(100, 10), window(100, 13)], 10)
    # on a percentile instead of the average
    assert is_stable([window(100, 10), window(100, 10.5), window(100, 9.5)], 10, percentile=99)


def snapshot(success: int, queue_ns: int, infer_ns: int, inferences: int, executions: int) -> dict:
    stats = {
        "success": {"count": success, "ns": 0},
        "queue": {"count": success, "ns": queue_ns},
        "compute_input": {"count": success, "ns": 0},
        "compute_infer": {"count": success, "ns": infer_ns},
        "compute_output": {"count": success, "ns": 0},
    }
    return {"model_stats": [{"inference_count": inferences, "execution_count": executions, "inference_stats": stats}]}


def test_server_side_is_the_delta_of_two_snapshots_per_request():
    before = snapshot(10, 1_000_000, 5_000_000, 10, 10)
    after = snapshot(30, 5_000_000, 25_000_000, 50, 20)
    delta = server_delta(before, after)
    assert delta.requests == 20
    assert delta.queue_us == 200.0  # 4 ms over 20 requests
    assert delta.compute_infer_us == 1000.0
    assert delta.avg_batch_size == 4.0  # 40 inferences in 10 executions


def test_server_delta_reads_grpc_uint64_strings():
    grpc_like = {"model_stats": [{"inference_count": "8", "execution_count": "2", "inference_stats": {}}]}
    assert server_delta({"model_stats": []}, grpc_like).avg_batch_size == 4.0

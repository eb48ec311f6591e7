"""inference/statistics_merge.py: replicas' statistics merge as one scheduler's would read (counts
and durations add, `last_inference` is the later, batch sizes merge by size), a replica's view
(quantiles, free credits) is the first one's, and merging is associative with an all-zero unit."""

from __future__ import annotations

import functools

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference import statistics_merge as merge
from services.scheduler.statistics.stats import ModelStats
from shared.wire.statistics import (
    BatchStats,
    Duration,
    InferenceStats,
    Latency,
    MemoryUsage,
    ModelStatistics,
    ResponseStats,
    SchedulerStatistics,
    StepStats,
    VersionStatistics,
)

_counts = st.integers(0, 10**12)
_durations = st.builds(Duration, _counts, _counts)
_batches = st.lists(
    st.builds(BatchStats, st.integers(1, 64), _durations, _durations, _durations),
    unique_by=lambda b: b.batch_size,
    max_size=4,
).map(lambda batches: sorted(batches, key=lambda b: b.batch_size))
_steps = st.one_of(
    st.just(msgspec.UNSET),
    st.dictionaries(st.sampled_from(["pre", "post"]), st.builds(StepStats, _durations, _durations)),
)
_names = st.sampled_from(["w1", "w2", "w3"])


def _model_statistics(name: str, version: str) -> st.SearchStrategy[ModelStatistics]:
    return st.builds(
        ModelStatistics,
        name=st.just(name),
        version=st.just(version),
        last_inference=_counts,
        inference_count=_counts,
        execution_count=_counts,
        inference_stats=st.builds(InferenceStats, *[_durations] * 8),
        response_stats=st.dictionaries(st.sampled_from(["0", "1"]), st.builds(ResponseStats, *[_durations] * 6)),
        batch_stats=_batches,
        memory_usage=st.lists(st.builds(MemoryUsage, st.sampled_from(["CPU", "GPU"]), st.integers(0, 3), _counts)),
        ensemble_steps=_steps,
    )


_latencies = st.builds(
    Latency,
    quantiles=st.dictionaries(
        st.sampled_from(["request", "queue"]), st.dictionaries(st.sampled_from(["0.5", "0.9"]), st.floats(0, 1e6))
    ),
    first_response_buckets=st.just([100.0, 500.0, 2000.0, 5000.0]),
    first_response_counts=st.lists(_counts, min_size=5, max_size=5),
    first_response_sum_ms=st.integers(0, 10**9).map(float),  # whole numbers: their sums are exact
)


def _versions(name: str = "m", version: str = "1") -> st.SearchStrategy[VersionStatistics]:
    return st.builds(
        VersionStatistics,
        stats=_model_statistics(name, version),
        fail_reasons=st.dictionaries(st.sampled_from(["REJECTED", "BACKEND"]), _counts),
        pending=_counts,
        free_credits=st.integers(0, 8),
        cache_enabled=st.booleans(),
        latency=_latencies,
        worker_compute_ns=st.dictionaries(_names, _counts),
        worker_executions=st.dictionaries(_names, _counts),
        retries=_counts,
    )


_replies = st.builds(
    lambda first, second, served: SchedulerStatistics(
        {f"m/{v.stats.version}": v for v in (first, second) if v.stats.version in served}
    ),
    _versions("m", "1"),
    _versions("m", "2"),
    st.sets(st.sampled_from(["1", "2"])),
)


def _zero(entry: VersionStatistics) -> VersionStatistics:
    return VersionStatistics(ModelStatistics(entry.stats.name, entry.stats.version))


@given(_versions())
def test_an_all_zero_entry_changes_nothing_on_either_side(entry):
    assert merge.version_statistics(entry, _zero(entry)) == entry
    assert merge.version_statistics(_zero(entry), entry) == entry


@given(_versions(), _versions(), _versions())
def test_merging_is_associative(a, b, c):
    left = merge.version_statistics(merge.version_statistics(a, b), c)
    right = merge.version_statistics(a, merge.version_statistics(b, c))
    assert left == right


@given(_versions(), _versions())
def test_counts_add_whichever_replica_comes_first(a, b):
    ab, ba = merge.version_statistics(a, b), merge.version_statistics(b, a)
    assert ab.stats.inference_stats == ba.stats.inference_stats
    assert ab.stats.inference_count == a.stats.inference_count + b.stats.inference_count
    assert ab.stats.last_inference == max(a.stats.last_inference, b.stats.last_inference)
    assert ab.stats.batch_stats == ba.stats.batch_stats
    assert [s.batch_size for s in ab.stats.batch_stats] == sorted(
        {s.batch_size for s in a.stats.batch_stats + b.stats.batch_stats}
    )
    assert (ab.fail_reasons, ab.worker_compute_ns, ab.retries) == (ba.fail_reasons, ba.worker_compute_ns, ba.retries)
    assert ab.latency.first_response_counts == [
        x + y for x, y in zip(a.latency.first_response_counts, b.latency.first_response_counts)
    ]
    assert (ab.latency.quantiles, ab.free_credits) == (
        a.latency.quantiles or b.latency.quantiles,
        a.free_credits or b.free_credits,
    )


@settings(max_examples=40)  # each example is four versions
@given(_replies, _replies)
def test_replies_merge_each_version_and_keep_the_others(a, b):
    merged = merge.scheduler_statistics(a, b)
    assert set(merged.versions) == set(a.versions) | set(b.versions)
    for key, entry in merged.versions.items():
        if key in a.versions and key in b.versions:
            assert entry == merge.version_statistics(a.versions[key], b.versions[key])
        else:
            assert entry == a.versions.get(key, b.versions.get(key))


@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 10**6), st.booleans()), max_size=12), st.integers(0, 12))
def test_two_replicas_read_as_one_that_served_every_request(events, cut):
    """What one scheduler counts, split over two, merges back to the same statistics."""
    one, first, second = ModelStats(), ModelStats(), ModelStats()
    for i, (size, ns, ok) in enumerate(events):
        for stats in (first if i < cut else second, one):
            stats.record_queue(ns)
            stats.record_batch(size, size, ns, 2 * ns, 3 * ns)
            stats.record_request(ok, 5 * ns)
    merged = merge.model_statistics(first.statistics("m", "1"), second.statistics("m", "1"))
    expected = one.statistics("m", "1")
    assert (merged.last_inference > 0) == (expected.last_inference > 0) == bool(events)
    assert msgspec.structs.replace(merged, last_inference=0) == msgspec.structs.replace(expected, last_inference=0)


def test_two_replicas_of_one_version():
    a = VersionStatistics(
        ModelStatistics(
            "m",
            "1",
            last_inference=5,
            inference_count=2,
            inference_stats=InferenceStats(success=Duration(2, 10)),
            batch_stats=[BatchStats(1, compute_infer=Duration(2, 4))],
        ),
        latency=Latency({"request": {"0.5": 3.0}}, [100.0], [1, 0]),
    )
    b = VersionStatistics(
        ModelStatistics(
            "m",
            "1",
            last_inference=9,
            inference_count=3,
            inference_stats=InferenceStats(success=Duration(3, 20)),
            batch_stats=[BatchStats(1, compute_infer=Duration(1, 1)), BatchStats(4, compute_infer=Duration(1, 7))],
            ensemble_steps={"pre": StepStats(Duration(1, 2))},
        ),
        latency=Latency({"request": {"0.5": 8.0}}, [100.0], [0, 2]),
    )
    merged = merge.version_statistics(a, b)
    assert (merged.stats.name, merged.stats.last_inference, merged.stats.inference_count) == ("m", 9, 5)
    assert merged.stats.inference_stats.success == Duration(5, 30)
    assert merged.stats.batch_stats == [
        BatchStats(1, compute_infer=Duration(3, 5)),
        BatchStats(4, compute_infer=Duration(1, 7)),
    ]
    assert merged.stats.ensemble_steps == {"pre": StepStats(Duration(1, 2))}
    assert merged.latency.quantiles == {"request": {"0.5": 3.0}}
    assert merged.latency.first_response_counts == [1, 2]


@pytest.mark.parametrize(("a", "b", "merged"), [([1, 2], [3], [1, 2]), ([], [0, 4], [0, 4])])
def test_histograms_of_different_buckets_keep_the_longer(a, b, merged):
    assert (
        merge.latency(Latency(first_response_counts=a), Latency(first_response_counts=b)).first_response_counts
        == merged
    )


def test_merging_three_replies_in_any_grouping():
    replies = [
        SchedulerStatistics({f"m/{i}": VersionStatistics(ModelStatistics("m", str(i)), pending=i)}) for i in (1, 2, 1)
    ]
    merged = functools.reduce(merge.scheduler_statistics, replies)
    assert list(merged.versions) == ["m/1", "m/2"] and merged.versions["m/1"].pending == 2

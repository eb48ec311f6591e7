"""services/scheduler/statistics/report.py: the reply is built as Structs, one entry per version
this replica owns or has served, with what `/metrics` reads beside Triton's statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.scheduler.statistics.reasons import FailReason
from services.scheduler.statistics.report import report
from services.scheduler.statistics.stats import ModelStats
from shared.wire.statistics import Duration


@dataclass
class _Queue:
    key: tuple[str, int]
    stats: ModelStats = field(default_factory=ModelStats)
    free: list[str] = field(default_factory=list)
    cache_enabled: bool = False


def test_owned_and_served_versions_are_reported():
    owned, served, idle = _Queue(("a", 1), free=["w1", "w2"], cache_enabled=True), _Queue(("b", 3)), _Queue(("c", 1))
    served.stats.record_batch(2, 2, 10, 20, 30)
    served.stats.record_request(False, 40, FailReason.REJECTED)
    served.stats.worker_compute_ns["w1"] = 20
    reply = report([owned, served, idle], lambda model: model == "a", [0.5], lambda q: len(q.key[0]))
    assert list(reply.versions) == ["a/1", "b/3"]
    a, b = reply.versions["a/1"], reply.versions["b/3"]
    assert (a.stats.name, a.stats.version, a.free_credits, a.cache_enabled, a.pending) == ("a", "1", 2, True, 1)
    assert (b.stats.execution_count, b.stats.inference_count, b.fail_reasons) == (1, 2, {"REJECTED": 1})
    assert b.stats.inference_stats.fail == Duration(1, 40)
    assert [s.batch_size for s in b.stats.batch_stats] == [2] and b.worker_compute_ns == {"w1": 20}
    # the rejected request was answered (an error): a first response, as Triton observes every one sent
    assert b.latency.quantiles["compute_infer"] == {"0.5": 0.02} and b.latency.first_response_counts == [1, 0, 0, 0, 0]


def test_the_autoscaling_signals_are_reported_per_version():
    from services.scheduler.statistics.report import Signals

    owned = _Queue(("a", 1))
    reply = report([owned], lambda model: True, [], lambda q: 3, lambda q: Signals(2_500_000, 2, 1, 4))
    a = reply.versions["a/1"]
    assert (a.pending, a.oldest_wait_us, a.running_batches, a.busy_instances, a.instances) == (3, 2_500_000, 2, 1, 4)

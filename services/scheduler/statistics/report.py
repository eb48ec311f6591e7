"""The scheduler's answer to a statistics request: per model version, Triton's statistics and
what the gateway merges across replicas (failure reasons, latency quantiles, utilisation)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sized
from typing import Protocol, TypeVar

import msgspec

from services.scheduler.statistics.stats import ModelStats
from shared.wire.control import StatisticsRequest
from shared.wire.statistics import SchedulerStatistics, VersionStatistics


class Reported(Protocol):
    """One model version's queue, as far as its statistics go (`batching.model_queue.ModelQueue`)."""

    @property
    def key(self) -> tuple[str, int]: ...
    @property
    def stats(self) -> ModelStats: ...
    @property
    def free(self) -> Sized: ...
    @property
    def cache_enabled(self) -> bool: ...


R = TypeVar("R", bound=Reported)


def quantiles_asked(data: bytes) -> list[float]:
    """A request may ask for latency quantiles (the metrics' summaries): a `StatisticsRequest`."""
    if not data:
        return []
    try:
        return msgspec.json.decode(data, type=StatisticsRequest).quantiles
    except msgspec.DecodeError:  # msgspec.ValidationError is one
        return []


class Signals(msgspec.Struct, frozen=True):
    """One queue's autoscaling signals now (`pump.Pump`): what `VersionStatistics` carries of them."""

    oldest_wait_us: int = 0
    running_batches: int = 0
    busy_instances: int = 0
    instances: int = 0


def _no_signals(queue: object) -> Signals:
    return Signals()


def report(
    queues: Iterable[R],
    owns: Callable[[str], bool],
    quantiles: list[float],
    pending: Callable[[R], int],
    signals: Callable[[R], Signals] = _no_signals,
) -> SchedulerStatistics:
    """Versions of the models this replica owns, and of any it served before (the gateway sums
    replicas); `pending(queue)`: its requests not started yet; `signals(queue)`: its autoscaling signals."""
    return SchedulerStatistics(
        {
            f"{model}/{version}": VersionStatistics(
                stats=q.stats.statistics(model, str(version)),
                fail_reasons=dict(q.stats.fail_reasons),
                pending=pending(q),
                free_credits=len(q.free),
                cache_enabled=q.cache_enabled,
                latency=q.stats.latencies.report(quantiles),
                worker_compute_ns=dict(q.stats.worker_compute_ns),
                worker_executions=dict(q.stats.worker_executions),
                retries=q.stats.retries,
                **msgspec.structs.asdict(signals(q)),
            )
            for q in queues
            for model, version in (q.key,)
            if owns(model) or q.stats.success.count or q.stats.fail.count or q.stats.cache_miss.count
        }
    )

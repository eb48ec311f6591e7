"""Pure statistics of a measurement: client windows, stability, the server's side from stats deltas.

Units follow perf_analyzer's report: latencies in microseconds, throughput in inferences per second
(requests x batch size).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

PERCENTILES = (50, 90, 95, 99)


@dataclass(slots=True)
class Record:
    """One completed request: wall-clock span and the client's own send/receive work, in ns."""

    start_ns: int
    end_ns: int
    send_ns: int = 0
    recv_ns: int = 0


@dataclass
class ClientStats:
    requests: int
    duration_s: float
    throughput: float
    avg_us: float
    percentiles_us: dict[int, float] = field(default_factory=dict)
    send_us: float = 0.0
    recv_us: float = 0.0

    def latency_us(self, percentile: int | None) -> float:
        return self.avg_us if percentile is None else self.percentiles_us[percentile]


def percentile_of(sorted_values: Sequence[int], p: float) -> float:
    """Nearest rank, as perf_analyzer reports it."""
    if not sorted_values:
        return 0.0
    rank = math.ceil(p / 100 * len(sorted_values))
    return float(sorted_values[min(len(sorted_values), max(rank, 1)) - 1])


def client_stats(
    records: Sequence[Record], duration_ns: int, batch_size: int, percentiles: Sequence[int] = PERCENTILES
) -> ClientStats:
    n = len(records)
    duration_s = max(duration_ns, 1) / 1e9
    if n == 0:
        return ClientStats(0, duration_s, 0.0, 0.0, {p: 0.0 for p in percentiles})
    latencies = sorted(r.end_ns - r.start_ns for r in records)
    return ClientStats(
        requests=n,
        duration_s=duration_s,
        throughput=n * batch_size / duration_s,
        avg_us=sum(latencies) / n / 1e3,
        percentiles_us={p: percentile_of(latencies, p) / 1e3 for p in percentiles},
        send_us=sum(r.send_ns for r in records) / n / 1e3,
        recv_us=sum(r.recv_ns for r in records) / n / 1e3,
    )


def is_stable(windows: Sequence[ClientStats], pct: float, percentile: int | None = None, count: int = 3) -> bool:
    """perf_analyzer's rule: the last `count` windows' throughput and latency each within pct % of their mean."""
    if len(windows) < count:
        return False
    last = windows[-count:]
    if any(w.requests == 0 for w in last):
        return False
    for values in ([w.throughput for w in last], [w.latency_us(percentile) for w in last]):
        mean = sum(values) / count
        if any(abs(v - mean) > mean * pct / 100 for v in values):
            return False
    return True


@dataclass
class ServerStats:
    """The server's side of a span of time, from the difference of two statistics snapshots."""

    requests: int = 0
    inferences: int = 0
    executions: int = 0
    queue_us: float = 0.0
    compute_input_us: float = 0.0
    compute_infer_us: float = 0.0
    compute_output_us: float = 0.0

    @property
    def avg_batch_size(self) -> float:
        return self.inferences / self.executions if self.executions else 0.0


def _totals(stats: dict) -> dict[str, int]:
    """Counts and ns of the statistics endpoint's answer, summed over the versions it lists."""
    totals: dict[str, int] = {}
    for model in stats.get("model_stats", []):
        for key in ("inference_count", "execution_count"):
            totals[key] = totals.get(key, 0) + int(model.get(key, 0))
        for key, value in model.get("inference_stats", {}).items():
            for part in ("count", "ns"):
                name = f"{key}.{part}"
                totals[name] = totals.get(name, 0) + int(value.get(part, 0))
    return totals


def server_delta(before: dict, after: dict) -> ServerStats:
    b, a = _totals(before), _totals(after)

    def delta(key: str) -> int:
        return a.get(key, 0) - b.get(key, 0)

    def avg_us(key: str) -> float:
        count = delta(f"{key}.count")
        return delta(f"{key}.ns") / count / 1e3 if count else 0.0

    return ServerStats(
        requests=delta("success.count"),
        inferences=delta("inference_count"),
        executions=delta("execution_count"),
        queue_us=avg_us("queue"),
        compute_input_us=avg_us("compute_input"),
        compute_infer_us=avg_us("compute_infer"),
        compute_output_us=avg_us("compute_output"),
    )


@dataclass
class LevelResult:
    """One concurrency or request-rate level: the merged stable windows."""

    mode: str
    level: float
    client: ClientStats
    server: ServerStats
    stable: bool
    windows: int
    completed: int = 0  # every request that succeeded at this level, inside the windows or not

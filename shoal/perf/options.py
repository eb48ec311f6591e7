"""What one `shoal perf` run measures: perf_analyzer's flags, parsed into plain values."""

from __future__ import annotations

from dataclasses import dataclass, field


class PerfError(Exception):
    """A run that cannot go on: bad flags, an unreachable server, a request the server refused."""


@dataclass
class PerfOptions:
    model: str
    url: str = "localhost:8000"
    protocol: str = "http"
    streaming: bool = False  # gRPC only: requests on bidirectional streams (perf_analyzer's --streaming)
    model_version: str = ""
    batch_size: int = 1
    concurrency: list[int] = field(default_factory=lambda: [1])
    request_rates: list[float] = field(default_factory=list)  # non-empty: request-rate mode
    shapes: dict[str, list[int]] = field(default_factory=dict)
    input_data: str = "random"  # zero | random | a perf_analyzer JSON file
    window_ms: int = 5000
    stability_pct: float = 10.0
    max_trials: int = 10
    percentile: int | None = None  # stabilise on this percentile instead of the average
    latency_limit_ms: float = 0.0  # stop the sweep past a level above it (0: no limit)
    shared_memory: str = "none"  # none | system
    output_shm_size: int = 102400
    request_timeout_s: float = 60.0

    @property
    def levels(self) -> list[float]:
        return list(self.request_rates) if self.request_rates else [float(c) for c in self.concurrency]

    @property
    def mode(self) -> str:
        return "request_rate" if self.request_rates else "concurrency"


def parse_range(text: str, kind: type = int) -> list:
    """perf_analyzer's `start:end:step` (end and step optional) as the list of levels."""
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not all(parts):
        raise PerfError(f"invalid range '{text}': expected start[:end[:step]]")
    try:
        start = kind(parts[0])
        end = kind(parts[1]) if len(parts) > 1 else start
        step = kind(parts[2]) if len(parts) > 2 else kind(1)
    except ValueError:
        raise PerfError(f"invalid range '{text}': numbers expected") from None
    if start <= 0 or step <= 0 or end < start:
        raise PerfError(f"invalid range '{text}': need 0 < start <= end and step > 0")
    levels, value = [], start
    while value <= end + 1e-9:
        levels.append(value)
        value += step
    return levels


def parse_shape(text: str) -> tuple[str, list[int]]:
    """`--shape NAME:d1,d2,...` (the dims without the batch dimension, as perf_analyzer)."""
    name, sep, dims = text.rpartition(":")
    try:
        shape = [int(d) for d in dims.split(",")]
    except ValueError:
        shape = []
    if not sep or not name or not shape or any(d < 0 for d in shape):
        raise PerfError(f"invalid --shape '{text}': expected NAME:d1,d2,... with non-negative dims")
    return name, shape

"""Where an ensemble's time goes: per-step latency and the steps' compute phases."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.scheduler.statistics.stats import Duration


@dataclass
class StepLatency:
    """Per-step latency of one ensemble version (Triton has none; docs/triton-spec.md §7 row 5)."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)


_PHASES = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


def compute_phases(trace: dict[str, int]) -> tuple[int, int, int]:
    """A step's compute input/infer/output durations from the timestamps its worker (or inner
    ensemble) put in the response."""
    start, input_end, output_start, end = (trace.get(k, 0) for k in _PHASES)
    if not start or not end:
        return 0, 0, 0
    return input_end - start, output_start - input_end, end - output_start

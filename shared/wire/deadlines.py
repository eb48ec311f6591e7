"""A request's deadline as the wire carries it: wall-clock nanoseconds (`InferRequest.deadline_ns`,
set once by the gateway that took the request: inference/forward.py), so that every process on
every host reads the same instant. This is the one place that turns it into seconds left."""

from __future__ import annotations

import time


def seconds_left(deadline_ns: int, at_least: float = float("-inf")) -> float:
    """Seconds until `deadline_ns` (on `time.time_ns()`'s scale), never under `at_least`: a timeout
    handed to asyncio or to a bus request must stay positive after the deadline has just passed,
    while a caller that compares against it wants the true (possibly negative) figure."""
    return max(at_least, (deadline_ns - time.time_ns()) / 1e9)

"""Metrics a built-in backend reports on `/metrics` beside Triton's own (Triton's identity backend
counts its input bytes, for one). They go in the worker's one registry of custom metrics, the one
a python model's `pb_utils.MetricFamily` fills, which the worker publishes with its heartbeats:
a backend asks for a counter here and sees nothing of the python backend's API.
"""

from __future__ import annotations

from typing import Protocol

from services.worker.python.triton_api.custom_metrics import MetricFamily


class Counter(Protocol):
    def increment(self, value: float) -> None: ...


def counter(name: str, description: str, labels: dict[str, str]) -> Counter:
    """The counter `name` with these labels; instances asking for the same one share it."""
    return MetricFamily(name, description, MetricFamily.COUNTER).Metric(labels=labels)

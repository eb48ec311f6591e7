"""Custom metrics of python models (`pb_utils.MetricFamily`), kept per process and published
by the worker with its heartbeats (see services/gateway/metrics/custom.py)."""

from __future__ import annotations

import re
import threading

from services.worker.python.triton_api.triton_errors import TritonModelException
from shared.wire.control import MetricSample, MetricSnapshot

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_families: dict[str, MetricFamily] = {}
_metrics_lock = threading.Lock()


class MetricFamily:
    """A custom metric family, shown on `/metrics` next to Triton's (summed over workers)."""

    COUNTER, GAUGE, HISTOGRAM = 0, 1, 2
    _KINDS = {0: "counter", 1: "gauge", 2: "histogram"}

    def __init__(self, name: str, description: str, kind: int) -> None:
        if not _METRIC_NAME.match(name):
            raise TritonModelException(f"invalid metric family name '{name}'")
        if kind not in self._KINDS:
            raise TritonModelException(f"unknown metric family kind {kind}")
        self.name, self.description, self.kind = name, description, kind
        self._metrics: dict[tuple, Metric] = {}
        with _metrics_lock:
            existing = _families.get(name)
            if existing is not None and existing.kind != kind:
                raise TritonModelException(f"metric family '{name}' already exists with another kind")
            if existing is not None:  # another instance of the model: the same family
                self._metrics = existing._metrics
            _families[name] = self

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:  # noqa: N802
        bad = [k for k in labels or {} if not _LABEL_NAME.match(k)]
        if bad:
            raise TritonModelException(f"invalid metric label name '{bad[0]}'")
        if self.kind == self.HISTOGRAM and not buckets:
            raise TritonModelException("a histogram metric needs buckets")
        key = tuple(sorted((labels or {}).items()))
        with _metrics_lock:
            metric = self._metrics.get(key)
            if metric is None:
                metric = self._metrics[key] = Metric(self.kind, dict(key), sorted(buckets or []))
            return metric


class Metric:
    def __init__(self, kind: int, labels: dict[str, str], buckets: list[float]) -> None:
        self._kind, self.labels, self.buckets = kind, labels, buckets
        self._value = 0.0
        self._counts = [0] * (len(buckets) + 1)
        self._sum = 0.0

    def increment(self, value: float) -> None:
        if self._kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("increment is not supported for histograms; use observe")
        if self._kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException("a counter cannot be decremented")
        with _metrics_lock:
            self._value += value

    def set(self, value: float) -> None:
        if self._kind != MetricFamily.GAUGE:
            raise TritonModelException("set is only supported for gauges")
        with _metrics_lock:
            self._value = value

    def observe(self, value: float) -> None:
        if self._kind != MetricFamily.HISTOGRAM:
            raise TritonModelException("observe is only supported for histograms")
        with _metrics_lock:
            index = next((i for i, bound in enumerate(self.buckets) if value <= bound), len(self.buckets))
            self._counts[index] += 1
            self._sum += value

    def value(self) -> float:
        if self._kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("value is not supported for histograms")
        return self._value


def metrics_snapshot() -> list[MetricSnapshot]:
    """Every custom family and its samples, for the gateways' `/metrics`."""
    with _metrics_lock:
        return [
            MetricSnapshot(
                f.name,
                f.description,
                MetricFamily._KINDS[f.kind],
                [
                    MetricSample(dict(m.labels), m._value, list(m.buckets), list(m._counts), m._sum)
                    for m in f._metrics.values()
                ],
            )
            for f in _families.values()
        ]

"""Triton's trace extension (triton mode): settings, sampling, and the JSON trace file.

Timestamps are CLOCK_MONOTONIC nanoseconds, taken where each event happens: the
gateway (request start/end), the scheduler (queue start, and why the batch left) and
the worker (compute phases); all processes on a host share that clock.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field, replace
from typing import Any

from shared.errors import invalid, unsupported

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
ORDER = (
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
)


@dataclass(frozen=True)
class TraceSettings:
    level: tuple[str, ...] = ("OFF",)
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""

    def json(self) -> dict[str, Any]:
        return {
            "trace_level": list(self.level),
            "trace_rate": str(self.rate),
            "trace_count": str(self.count),
            "log_frequency": str(self.log_frequency),
            "trace_file": self.file,
            "trace_mode": "triton",
        }

    @property
    def enabled(self) -> bool:
        return self.level != ("OFF",) and self.count != 0


def _int(body: dict, key: str, minimum: int) -> int:
    value = body[key]
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise invalid(f"Unable to parse '{key}', got: {value}") from None
    if number < minimum:
        raise invalid(f"'{key}' must be >= {minimum}, got: {value}")
    return number


def updated(current: TraceSettings, body: dict[str, Any]) -> dict[str, Any]:
    """The fields a POST body sets; a `None` value means "clear the override"."""
    if not isinstance(body, dict):
        raise invalid("trace settings must be a JSON object")
    changes: dict[str, Any] = {}
    for key, value in body.items():
        if key == "trace_file":
            if value is not None:
                raise unsupported("trace file location can not be updated through network protocol")
            continue
        if value is None:
            changes[key] = None
        elif key == "trace_level":
            levels = tuple(value) if isinstance(value, list) else (value,)
            if not levels or any(level not in LEVELS for level in levels):
                raise invalid(f"invalid trace level: {value}")
            if "OFF" in levels and len(levels) > 1:
                raise invalid("trace level 'OFF' can not be combined with other levels")
            if "TENSORS" in levels:
                raise unsupported("trace level 'TENSORS' is not supported by Shoal yet (use TIMESTAMPS)")
            changes[key] = levels
        elif key == "trace_rate":
            changes[key] = _int(body, key, 1)
        elif key == "trace_count":
            changes[key] = _int(body, key, -1)
        elif key == "log_frequency":
            changes[key] = _int(body, key, 0)
        elif key == "trace_mode":
            if value != "triton":
                raise unsupported(f"trace mode '{value}' is not supported (only 'triton')")
        else:
            raise invalid(f"unknown trace setting '{key}'")
    return changes


_FIELDS = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}


@dataclass
class Tracer:
    settings: TraceSettings
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)  # model -> field -> value
    _seen: dict[str, int] = field(default_factory=dict)
    _next_id: int = 1
    _written: list[dict[str, Any]] = field(default_factory=list)
    _file_index: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def for_model(self, model: str) -> TraceSettings:
        return replace(self.settings, **self.overrides.get(model, {}))

    def update_global(self, body: dict[str, Any]) -> TraceSettings:
        changes = {_FIELDS[k]: v for k, v in updated(self.settings, body).items() if v is not None}
        self.settings = replace(self.settings, **changes)
        return self.settings

    def update_model(self, model: str, body: dict[str, Any]) -> TraceSettings:
        model_overrides = self.overrides.setdefault(model, {})
        for key, value in updated(self.for_model(model), body).items():
            if value is None:
                model_overrides.pop(_FIELDS[key], None)
            else:
                model_overrides[_FIELDS[key]] = value
        return self.for_model(model)

    def sample(self, model: str) -> bool:
        """Every `trace_rate`-th request of a model is traced, up to `trace_count` traces."""
        # the settings copied only for a model with overrides: this runs on every request
        settings = self.for_model(model) if model in self.overrides else self.settings
        if not settings.enabled or not settings.file:
            return False
        seen = self._seen.get(model, 0) + 1
        self._seen[model] = seen
        if seen % settings.rate:
            return False
        if settings.count > 0:
            remaining = settings.count - 1
            if model in self.overrides and "count" in self.overrides[model]:
                self.overrides[model]["count"] = remaining
            else:
                self.settings = replace(self.settings, count=remaining)
        return True

    def record(
        self, model: str, version: int, request_id: str, timestamps: dict[str, int], extra: dict[str, Any]
    ) -> None:
        settings = self.for_model(model)
        trace_id = self._next_id
        self._next_id += 1
        events = sorted(timestamps.items(), key=lambda kv: (kv[1], ORDER.index(kv[0]) if kv[0] in ORDER else 99))
        self._written.append(
            {"id": trace_id, "model_name": model, "model_version": version, "request_id": request_id, **extra}
        )
        self._written.append({"id": trace_id, "timestamps": [{"name": n, "ns": ns} for n, ns in events]})
        self._flush(settings)

    def _flush(self, settings: TraceSettings) -> None:
        """log_frequency 0: one file, rewritten whole so it is always valid JSON;
        N > 0: every N traces go to `<file>.<index>` and the buffer starts again."""
        with self._lock:
            if settings.log_frequency > 0:
                if len(self._written) < 2 * settings.log_frequency:
                    return
                path = f"{settings.file}.{self._file_index}"
                self._file_index += 1
                records, self._written = self._written, []
            else:
                path, records = settings.file, self._written
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                json.dump(records, f)
            os.replace(tmp, path)

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
from typing import Any, NamedTuple

import msgspec

from shared.errors import invalid, unsupported
from shared.tracing.spans import Tracing
from shared.wire.messages import BatchDelivery

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

    mode: str = "triton"  # or "opentelemetry": spans exported by every service (shared/tracing/)
    config: tuple[tuple[str, str], ...] = ()  # the mode's `--trace-config <mode>,<key>=<value>` entries

    def json(self) -> dict[str, Any]:
        """Triton's trace settings document (src/http_server.cc, `HandleTrace`): the file and log
        frequency only in triton mode, then the mode, then the mode's own settings."""
        body: dict[str, Any] = {
            "trace_level": list(self.level),
            "trace_rate": str(self.rate),
            "trace_count": str(self.count),
        }
        if self.mode == "triton":
            body["log_frequency"] = str(self.log_frequency)
            body["trace_file"] = self.file
        body["trace_mode"] = self.mode
        for key, value in self.config:
            body.setdefault(key, value)  # Triton writes a repeated key (resource) twice; JSON keeps the first
        return body

    @property
    def enabled(self) -> bool:
        return self.level != ("OFF",) and self.count != 0

    @property
    def valid(self) -> bool:
        """Whether requests are sampled at this rate (Triton's `TraceSetting::Valid`; rate 0: only
        requests that bring an OpenTelemetry context are traced)."""
        return self.enabled and self.rate > 0 and (self.mode != "triton" or bool(self.file))


def _int(body: dict[str, Any], key: str, minimum: int) -> int:
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
            changes[key] = levels
        elif key == "trace_rate":
            changes[key] = _int(body, key, 1)
        elif key == "trace_count":
            changes[key] = _int(body, key, -1)
        elif key == "log_frequency":
            changes[key] = _int(body, key, 0)
        elif key == "trace_mode":
            if value != current.mode:
                raise unsupported(f"trace mode can not be updated through network protocol (it is '{current.mode}')")
        else:
            raise invalid(f"unknown trace setting '{key}'")
    return changes


class TracedTensor(NamedTuple):
    name: str
    datatype: str
    shape: list[int]
    data: bytes | memoryview | None  # None: in the client's shared memory (not read for a trace)


def tensor_json(tensor: TracedTensor) -> dict[str, str]:
    """A tensor as Triton's TENSORS trace writes it (src/tracer.cc, `TraceTensorActivity`): its
    elements comma separated (C++ stream formatting: 6 significant digits for floats, BOOL as
    0/1, BYTES elements quoted), its shape comma separated, its datatype."""
    return {
        "name": tensor.name,
        "data": _elements(tensor) if tensor.data is not None else "",
        "shape": ",".join(str(d) for d in tensor.shape),
        "dtype": tensor.datatype,
    }


def _elements(tensor: TracedTensor) -> str:
    data = memoryview(tensor.data or b"").cast("B")
    if tensor.datatype == "BYTES":
        items, offset = [], 0
        while offset + 4 <= len(data):
            length = int.from_bytes(data[offset : offset + 4], "little")
            items.append('"' + bytes(data[offset + 4 : offset + 4 + length]).decode("utf-8", "replace") + '"')
            offset += 4 + length
        return ",".join(items)
    import numpy as np

    from shared.config.datatypes import numpy_dtype

    values = np.frombuffer(data, dtype=numpy_dtype(tensor.datatype)).ravel()
    if values.dtype.kind == "f":
        return ",".join(f"{float(v):g}" for v in values)
    return ",".join(str(int(v)) for v in values)


_FIELDS = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}


@dataclass
class Tracer:
    settings: TraceSettings
    tracing: Tracing | None = None  # opentelemetry mode: this process's exporter (shared/tracing/spans.py)
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

    def sample(self, model: str, forced: bool = False) -> bool:
        """Every `trace_rate`-th request of a model is traced, up to `trace_count` traces; in
        opentelemetry mode a request that brings a context (`forced`) is traced whatever the rate
        and count (Triton's `TraceSetting::SampleTrace`)."""
        # the settings copied only for a model with overrides: this runs on every request
        settings = self.for_model(model) if model in self.overrides else self.settings
        if not settings.valid:
            return forced and settings.level != ("OFF",)
        seen = self._seen.get(model, 0) + 1
        self._seen[model] = seen
        if seen % settings.rate:
            return forced
        if settings.count > 0:
            remaining = settings.count - 1
            if model in self.overrides and "count" in self.overrides[model]:
                self.overrides[model]["count"] = remaining
            else:
                self.settings = replace(self.settings, count=remaining)
        return True

    def record(
        self,
        model: str,
        version: int,
        request_id: str,
        timestamps: dict[str, int],
        batch: BatchDelivery | None,
        tensors: list[tuple[str, TracedTensor]] = (),  # type: ignore[assignment]
    ) -> None:
        """One trace into the file: its header, its timestamps, and with level TENSORS the
        (activity, tensor) entries: TENSOR_QUEUE_INPUT and TENSOR_BACKEND_OUTPUT."""
        settings = self.for_model(model)
        trace_id = self._next_id
        self._next_id += 1
        events = sorted(timestamps.items(), key=lambda kv: (kv[1], ORDER.index(kv[0]) if kv[0] in ORDER else 99))
        self._written.append(
            {
                "id": trace_id,
                "model_name": model,
                "model_version": version,
                "request_id": request_id,
                **(msgspec.structs.asdict(batch) if batch is not None else {}),
            }
        )
        self._written.append({"id": trace_id, "timestamps": [{"name": n, "ns": ns} for n, ns in events]})
        self._written.extend(
            {"id": trace_id, "activity": activity, "tensor": tensor_json(tensor)} for activity, tensor in tensors
        )
        self._flush(settings)

    def tensors_traced(self, model: str) -> bool:
        return "TENSORS" in (self.for_model(model) if model in self.overrides else self.settings).level

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

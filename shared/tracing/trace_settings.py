"""Triton's OpenTelemetry trace settings, read as tritonserver reads them (src/command_line_parser.cc,
`SetOpenTelemetryTraceArgs`, and src/tracer.cc, `ProcessOpenTelemetryParameters`).

`--trace-config mode=opentelemetry` turns the mode on; `--trace-config opentelemetry,<key>=<value>`
entries set the exporter: `url` (OTLP/HTTP), `resource=<key>=<value>` (repeatable), and the batch
span processor's `bsp_max_queue_size`, `bsp_schedule_delay` (ms) and `bsp_max_export_batch_size`,
whose defaults come from `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_SCHEDULE_DELAY` and
`OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (else 2048, 5000, 512). Other keys are kept and shown by the trace
settings endpoint, as tritonserver does, and change nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DEFAULT_URL = "http://localhost:4318/v1/traces"
SERVICE_NAME = "triton-inference-server"
_BSP = (
    ("bsp_max_queue_size", "OTEL_BSP_MAX_QUEUE_SIZE", "2048"),
    ("bsp_schedule_delay", "OTEL_BSP_SCHEDULE_DELAY", "5000"),
    ("bsp_max_export_batch_size", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512"),
)
_BSP_KEYS = frozenset(key for key, _, _ in _BSP)
_LEADING_NUMBER = re.compile(r"\s*([+-]?)(\d+)")
_UINT32_MAX = 2**32 - 1


class TraceConfigError(ValueError):
    """A `--trace-config` entry tritonserver would refuse, with its text."""


@dataclass(frozen=True)
class OtelSettings:
    """The exporter's settings; `entries` in the order the trace settings endpoint shows them."""

    url: str = DEFAULT_URL
    resource: tuple[tuple[str, str], ...] = ()
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay: int = 5000
    bsp_max_export_batch_size: int = 512
    entries: tuple[tuple[str, str], ...] = ()


def split(entry: str) -> tuple[str, str, str]:
    """(mode, setting, value) of one `--trace-config [<mode>,]<setting>=<value>` (tritonserver's
    `ParseTraceConfigOption`: the mode is what precedes the first comma; "" for a global setting)."""
    comma = entry.find(",")
    equals = entry.find("=", comma + 1)
    if comma == 0:
        raise TraceConfigError(
            "No trace mode specified. --trace-config option format is <trace mode>,<setting>=<value> or "
            f"<setting>=<value>. Got {entry}"
        )
    mode = entry[:comma].lower() if comma > 0 else ""
    if mode and mode not in ("triton", "opentelemetry"):
        raise TraceConfigError(
            f'invalid value for trace mode option: {mode}. Available options are "triton" and "opentelemetry"'
        )
    setting, value = entry[comma + 1 : equals], entry[equals + 1 :]
    if equals < 0 or not setting or not value:
        raise TraceConfigError(f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {entry}")
    return mode, setting, value


def mode(entries: Iterable[str]) -> str:
    """The trace mode the entries set (`mode=...`, the last one wins): triton or opentelemetry."""
    chosen = "triton"
    for entry in entries:
        section, setting, value = split(entry)
        if not section and setting == "mode":
            chosen = value.lower()
            if chosen not in ("triton", "opentelemetry"):
                raise TraceConfigError(
                    f'invalid value for trace mode option: {value}. Available options are "triton" and "opentelemetry"'
                )
    return chosen


def _uint32(value: str, where: str) -> int:
    """std::stoul's reading (the leading number), as tritonserver's `ParseOption<uint32_t>`."""
    match = _LEADING_NUMBER.match(value)
    if match is None:
        raise TraceConfigError(f'Bad option: "{where}".\nInvalid option value. Got {value}')
    number = int(match.group(2))
    if match.group(1) == "-" or number > _UINT32_MAX:
        raise TraceConfigError(f'Bad option: "{where}".\nProvided option value is out of bound. Got {value}')
    return number


def opentelemetry(entries: Iterable[str], env: Mapping[str, str] | None = None) -> OtelSettings:
    """The `opentelemetry,<key>=<value>` entries' settings, with the batch span processor's
    defaults from the environment for the keys not given."""
    env = os.environ if env is None else env
    shown: list[tuple[str, str]] = []
    values: dict[str, int] = {}
    url, resource = DEFAULT_URL, []
    for entry in entries:
        section, setting, value = split(entry)
        if section != "opentelemetry":
            continue
        if setting in _BSP_KEYS:
            values[setting] = _uint32(value, f"--trace-config opentelemetry,{setting}")
            value = str(values[setting])
        elif setting == "url":
            url = value
        elif setting == "resource":
            key, _, attribute = value.partition("=")
            resource.append((key, attribute))
        shown.append((setting, value))
    for key, variable, default in _BSP:
        if key not in values:
            values[key] = _uint32(env.get(variable, default), variable)
            shown.append((key, str(values[key])))
    return OtelSettings(
        url=url,
        resource=tuple(resource),
        bsp_max_queue_size=values["bsp_max_queue_size"],
        bsp_schedule_delay=values["bsp_schedule_delay"],
        bsp_max_export_batch_size=values["bsp_max_export_batch_size"],
        entries=tuple(shown),
    )


def endpoint(url: str) -> str:
    """The OTLP/HTTP URL to post to: tritonserver's exporter (libcurl) takes `host:port/path`
    without a scheme as http, the Python exporter needs the scheme."""
    return url if "://" in url else f"http://{url}"

"""Triton's logging extension: log settings changed at run time, applied in every service."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from shared.errors import Code, ShoalError, invalid, unsupported
from shared.process.logcontext import JsonFormatter
from shared.wire import subjects
from shared.wire.control import LogSettings

_FORMATS = {
    "default": "%(asctime)s %(levelname).1s {service} %(name)s: %(request_tag)s%(message)s",
    "ISO8601": "%(asctime)s %(levelname).1s {service} %(name)s: %(request_tag)s%(message)s",
}
_DATEFMT = {"default": None, "ISO8601": "%Y-%m-%dT%H:%M:%S%z"}


def update(current: LogSettings, body: Any) -> LogSettings:
    """Apply a POST /v2/logging body; `null` values are ignored, as in Triton."""
    if not isinstance(body, dict):
        raise invalid("the logging settings must be a JSON object")
    values = msgspec.structs.asdict(current)
    for key, value in body.items():
        if value is None:
            continue
        if key == "log_file":
            raise unsupported("log file location can not be updated through network protocol")
        if key in ("log_info", "log_warning", "log_error"):
            if not isinstance(value, bool):
                raise invalid(f"expect boolean for '{key}'")
        elif key == "log_verbose_level":
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise invalid("expect unsigned integer for 'log_verbose_level'")
        elif key == "log_format":
            if value not in _FORMATS:
                raise ShoalError(f"invalid argument for --log_format, got: {value}", Code.UNAVAILABLE)
        else:
            raise invalid(f"unknown logging setting '{key}'")
        values[key] = value
    return LogSettings(**values)


def apply(settings: LogSettings, service: str) -> None:
    level = logging.DEBUG if settings.log_verbose_level > 0 else logging.INFO
    if not settings.log_info:
        level = logging.WARNING
    if not settings.log_info and not settings.log_warning:
        level = logging.ERROR
    if not settings.log_info and not settings.log_warning and not settings.log_error:
        level = logging.CRITICAL + 1
    root = logging.getLogger()
    root.setLevel(level)
    formatter = logging.Formatter(_FORMATS[settings.log_format].format(service=service), _DATEFMT[settings.log_format])
    for handler in root.handlers:
        if not isinstance(handler.formatter, JsonFormatter):  # JSON lines stay JSON
            handler.setFormatter(formatter)


async def follow(nc: NATS, service: str) -> None:
    """Apply every logging update any gateway publishes."""

    async def on_update(msg: Msg) -> None:
        try:
            apply(msgspec.json.decode(msg.data, type=LogSettings), service)
        except msgspec.DecodeError:
            logging.getLogger(__name__).error("undecodable logging settings on %s", msg.subject)

    await nc.subscribe(subjects.LOGGING, cb=on_update)

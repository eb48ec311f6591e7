"""The request id on every log line about a request, and JSON log lines for containers.

Handlers set `request_ids` (a contextvar, so it follows the request's task and nothing
else); a logging filter copies it onto each record. With SHOAL_LOG_JSON=1 every line is
one JSON object (time, level, service, logger, message, request_id).
"""

from __future__ import annotations

import contextvars
import json
import logging
import time

request_ids: contextvars.ContextVar[str] = contextvars.ContextVar("request_ids", default="")


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        ids = request_ids.get()
        record.request_id = ids
        record.request_tag = f"[request id: {ids}] " if ids else ""
        return True


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = record.__dict__.get("request_id", "")  # set by RequestIdFilter
        if request_id:
            doc["request_id"] = request_id
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc)

"""Asking the repository service to load or unload a model (HTTP clients, and python models
through `pb_utils.load_model`)."""

from __future__ import annotations

from typing import Any

import msgspec
import orjson
from nats.aio.client import Client as NATS

from shared.errors import Code, ShoalError, unavailable
from shared.messages import ErrorReply


async def repository_call(nc: NATS, subject: str, payload: dict[str, Any], timeout: float) -> int:
    """The KV revision of the model's record after the change; the repository's error raises."""
    try:
        reply = await nc.request(subject, orjson.dumps(payload), timeout=timeout)
    except Exception as exc:
        raise unavailable(f"the repository service is not available: {type(exc).__name__}") from None
    if reply.data[:1] != b"{":
        error = msgspec.msgpack.decode(reply.data, type=ErrorReply)
        raise ShoalError(error.error, Code(error.code))
    revision: int = msgspec.json.decode(reply.data).get("revision", 0)
    return revision

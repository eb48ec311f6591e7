"""Asking the repository service to load, unload or demand a model (HTTP and gRPC clients, python
models through `pb_utils.load_model`, PyTriton processes)."""

from __future__ import annotations

import msgspec
from nats.aio.client import Client as NATS

from shared.errors import Code, ShoalError, unavailable
from shared.wire.control import DemandRequest, LoadRequest, RepositoryDone, UnloadRequest
from shared.wire.messages import ErrorReply

RepositoryRequest = LoadRequest | UnloadRequest | DemandRequest


async def repository_call(nc: NATS, subject: str, request: RepositoryRequest, timeout: float) -> int:
    """The KV revision of the model's record after the change; the repository's error raises."""
    try:
        reply = await nc.request(subject, msgspec.json.encode(request), timeout=timeout)
    except Exception as exc:
        raise unavailable(f"the repository service is not available: {type(exc).__name__}") from None
    if reply.data[:1] != b"{":  # an error is msgpack, a success JSON
        error = msgspec.msgpack.decode(reply.data, type=ErrorReply)
        raise ShoalError(error.error, Code(error.code))
    return msgspec.json.decode(reply.data, type=RepositoryDone).revision

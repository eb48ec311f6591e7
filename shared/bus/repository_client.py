"""Asking the repository service to load, unload or demand a model (HTTP and gRPC clients, python
models through `pb_utils.load_model`, PyTriton processes)."""

from __future__ import annotations

import time
from collections.abc import Awaitable

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import NoRespondersError

from shared.bus.patience import patiently
from shared.errors import Code, ShoalError, unavailable
from shared.wire.control import DemandRequest, LoadRequest, RepositoryDone, UnloadRequest
from shared.wire.messages import ErrorReply

RepositoryRequest = LoadRequest | UnloadRequest | DemandRequest


FIRST_PAUSE_S = 0.05
LONGEST_PAUSE_S = 0.5
AWAY_S = 10.0  # a repository restarting or reconnecting is back well within this; a dead one is a 503 then


async def repository_call(nc: NATS, subject: str, request: RepositoryRequest, timeout: float) -> int:
    """The KV revision of the model's record after the change; the repository's error raises.

    "No responders" is asked again within `timeout`: the repository is away for a moment (its
    process restarting, or its connection coming back after a nats-server restart, which the
    gateway's own may beat), and a load asked then failed at once with a 503. For `AWAY_S` at
    most: a repository that is gone answers the client within seconds, not at `timeout`."""
    payload = msgspec.json.encode(request)
    deadline = time.monotonic() + timeout

    def ask() -> Awaitable[Msg]:
        return nc.request(subject, payload, timeout=max(deadline - time.monotonic(), 0.001))

    try:
        reply = await patiently(ask, (NoRespondersError,), min(timeout, AWAY_S), FIRST_PAUSE_S, LONGEST_PAUSE_S)
    except Exception as exc:
        raise _unavailable(exc) from None
    if reply.data[:1] != b"{":  # an error is msgpack, a success JSON
        error = msgspec.msgpack.decode(reply.data, type=ErrorReply)
        raise ShoalError(error.error, Code(error.code))
    return msgspec.json.decode(reply.data, type=RepositoryDone).revision


def _unavailable(exc: Exception) -> ShoalError:
    return unavailable(f"the repository service is not available: {type(exc).__name__}")

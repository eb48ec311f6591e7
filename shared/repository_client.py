"""Asking the repository service to load, unload or demand a model (HTTP and gRPC clients, python
models through `pb_utils.load_model`, PyTriton processes)."""

from __future__ import annotations

import asyncio

import msgspec
from nats.aio.client import Client as NATS

from shared import bus
from shared.errors import Code, ShoalError, unavailable
from shared.wire import subjects
from shared.wire.control import DemandRequest, LoadRequest, RepositoryDone, RevisionSeen, RevisionWanted, UnloadRequest
from shared.wire.messages import ErrorReply, encode

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


async def gateways_have(nc: NATS, revision: int, timeout: float) -> bool:
    """Wait (at most about `timeout` seconds) until every gateway's view of the models bucket has
    `revision`; whether all of them say so (no gateway running: True). For a loader that is not a
    gateway (services/gateway/seen.py)."""
    # a quiet half second after the last gateway's answer: a loaded gateway answers late, and one
    # not counted here would not be waited for
    pings = await bus.gather(nc, f"$SRV.PING.{subjects.GATEWAY_SERVICE}", timeout=min(timeout, 2.0), settle=0.5)
    if not pings:
        return True
    wanted = encode(RevisionWanted(revision, timeout))
    try:
        # each gateway answers when its view arrives: wait for all of them, not for a quiet moment
        replies = await asyncio.wait_for(
            bus.gather(nc, subjects.GATEWAY_SEEN, wanted, expected=len(pings), timeout=timeout, settle=timeout),
            timeout + 1,
        )
    except asyncio.TimeoutError:  # a gateway counted above went away without answering
        return False
    return len(replies) >= len(pings) and all(map(_seen, replies))


def _seen(reply: bytes) -> bool:
    try:
        return msgspec.msgpack.decode(reply, type=RevisionSeen).seen
    except msgspec.DecodeError:
        return False

"""Subscribing and publishing on the hot path without nats-py's per-message queue, task and flusher
(what it takes of nats-py's internals: shared/bus/nats_internals.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NamedTuple

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from shared.bus import nats_internals


async def subscribe(nc: NATS, subject: str, cb: Callable[[Msg], Awaitable[None]], queue: str = "") -> Subscription:
    """`nc.subscribe` for the hot path (requests, batches, replies, credits): the callback runs
    as its message is read, without nats-py's per-subscription queue and task (an asyncio.Queue
    hand-off and a task switch per message). Same guarantees: one message at a time, in order."""
    sub = await nc.subscribe(subject, queue=queue, cb=cb)
    nats_internals.run_inline(nc, sub, cb)
    return sub


async def subscribe_now(nc: NATS, subject: str, cb: Callable[[Msg], None]) -> Subscription:
    """`subscribe` for a callback that never waits (a plain function): it runs as its message is
    read, without a coroutine per message. What it must wait for, it starts itself."""

    async def unused(msg: Msg) -> None:  # nats-py wants a coroutine function; never called
        cb(msg)

    sub = await nc.subscribe(subject, cb=unused)
    nats_internals.run_synchronously(nc, sub, cb)
    return sub


_CRLF = b"\r\n"


class Outgoing(NamedTuple):
    """A message for `publish_now` / `publish_all`."""

    subject: str
    payload: bytes
    reply: str = ""


def publish_now(nc: NATS, messages: list[Outgoing]) -> bool:
    """Write `messages` to the socket in this call, when nothing waits in
    nats-py's buffer to go before them: no flusher task to wake. False when it cannot (reconnecting,
    draining, something queued): `publish_all` then queues them behind. Raises as `publish_all`
    does for a message that cannot go (nothing goes then). For the hot path's few messages per
    batch, whose subjects are built by `shared.wire.subjects`."""
    transport = nats_internals.writable(nc)
    if transport is None:
        return False
    parts, _ = _commands(nc, messages)
    transport.writelines(parts)
    _count(nc, messages)
    return True


async def publish_all(nc: NATS, messages: list[Outgoing]) -> None:
    """Publish `messages` in order: what `nc.publish` does for each, less its per-call cost (subject
    validation, a command built by copying the payload, a flusher wake-up per message). Connected,
    they join nats-py's buffer and everything a process publishes in this turn of the event loop
    leaves in one socket write at its end (nats_internals.buffer_for_this_turn); while reconnecting
    it is `nc.publish` (its buffering rules). Raises what `nc.publish` raises for a message that
    cannot go (nothing goes then)."""
    parts, size = _commands(nc, messages)
    if nats_internals.buffer_for_this_turn(nc, parts, size):
        _count(nc, messages)
        return
    if not nc.is_connected:
        for subject, payload, reply in messages:
            await nc.publish(subject, payload, reply=reply)
        return
    if nc.is_closed:
        raise nats.errors.ConnectionClosedError
    if nc.is_draining_pubs:
        raise nats.errors.ConnectionDrainingError
    _count(nc, messages)
    await nats_internals.buffer(nc, parts, size)


def _plain(subject: str) -> bool:
    return subject.isprintable() and " " not in subject


def _commands(nc: NATS, messages: list[Outgoing]) -> tuple[list[bytes], int]:
    """The PUB commands of `messages` as parts for `writelines` (the payloads are not copied), and
    their size; nothing when one of them cannot go."""
    max_payload = nc.max_payload
    for subject, payload, reply in messages:
        # what nats-py's validation guards: a space or control character would break the PUB line
        if not subject or not _plain(subject) or (reply and not _plain(reply)):
            raise nats.errors.BadSubjectError
        if len(payload) > max_payload:
            raise nats.errors.MaxPayloadError
    parts: list[bytes] = []
    size = 0
    for subject, payload, reply in messages:
        if reply:
            header = b"PUB %s %s %d\r\n" % (subject.encode(), reply.encode(), len(payload))
        else:
            header = b"PUB %s %d\r\n" % (subject.encode(), len(payload))
        parts += (header, payload, _CRLF)
        size += len(header) + len(payload) + 2
    return parts, size


def _count(nc: NATS, messages: list[Outgoing]) -> None:
    """nats-py's statistics, as `nc.publish` keeps them."""
    size = 0
    for message in messages:
        size += len(message.payload)
    stats = nc.stats
    stats["out_msgs"] += len(messages)
    stats["out_bytes"] += size

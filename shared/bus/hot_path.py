"""Subscribing and publishing on the hot path without nats-py's per-message queue, task and flusher."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from shared.bus import eager
from shared.bus.connection import ErrorCallback


class _Inline:
    """Stands in for a nats-py subscription's pending queue: `_process_msg` hands each message
    to `put_nowait`, which runs the callback at once (shared/bus/eager.py) instead of waking the
    subscription's task through an asyncio.Queue. Messages of one subscription still run one
    at a time and in order; a callback's exception goes to the connection's error callback,
    as nats-py does, and never reaches its read loop."""

    def __init__(self, sub: Subscription, cb: Callable[[Msg], Awaitable[None]], error_cb: ErrorCallback) -> None:
        self._sub = sub
        self._runner = eager.SerialRunner(cb, lambda exc: eager.start(error_cb(exc)))  # type: ignore[arg-type]

    def put_nowait(self, msg: Msg) -> None:
        self._sub._pending_size -= len(msg.data)  # nats-py's slow-consumer accounting: not pending
        self._runner.put(msg)

    def qsize(self) -> int:
        return self._runner.backlog

    def empty(self) -> bool:
        return self._runner.backlog == 0

    def task_done(self) -> None:
        pass

    async def join(self) -> None:  # drain: wait until the callbacks in progress end
        while self._runner.backlog:
            await asyncio.sleep(0.005)

    def cancel(self) -> None:
        self._runner.cancel()


async def subscribe(nc: NATS, subject: str, cb: Callable[[Msg], Awaitable[None]], queue: str = "") -> Subscription:
    """`nc.subscribe` for the hot path (requests, batches, replies, credits): the callback runs
    as its message is read, without nats-py's per-subscription queue and task (an asyncio.Queue
    hand-off and a task switch per message). Same guarantees: one message at a time, in order."""
    sub = await nc.subscribe(subject, queue=queue, cb=cb)
    task = sub._wait_for_msgs_task
    if task is not None:  # never started: nothing can arrive before the SUB reaches the server
        task.cancel()
    inline = _Inline(sub, cb, nc._error_cb)
    while not sub._pending_queue.empty():  # defensive: hand over anything already queued
        inline.put_nowait(sub._pending_queue.get_nowait())
    sub._pending_queue = inline  # type: ignore[assignment]
    return sub


class _Synchronous:
    """`_Inline` for a callback that is a plain function: it runs as its message is read, with
    no coroutine to step, in a copy of the context (what it sets stays its own)."""

    def __init__(self, sub: Subscription, cb: Callable[[Msg], None], error_cb: ErrorCallback) -> None:
        self._sub, self._cb, self._error_cb = sub, cb, error_cb

    def put_nowait(self, msg: Msg) -> None:
        self._sub._pending_size -= len(msg.data)
        try:
            contextvars.copy_context().run(self._cb, msg)
        except Exception as exc:  # as nats-py does: to the error callback, never into its read loop
            eager.start(self._error_cb(exc))  # type: ignore[arg-type]

    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    def task_done(self) -> None:
        pass

    async def join(self) -> None:
        pass

    def cancel(self) -> None:
        pass


async def subscribe_now(nc: NATS, subject: str, cb: Callable[[Msg], None]) -> Subscription:
    """`subscribe` for a callback that never waits (a plain function): it runs as its message is
    read, without a coroutine per message. What it must wait for, it starts itself."""

    async def unused(msg: Msg) -> None:  # nats-py wants a coroutine function; never called
        cb(msg)

    sub = await nc.subscribe(subject, cb=unused)
    task = sub._wait_for_msgs_task
    if task is not None:
        task.cancel()
    synchronous = _Synchronous(sub, cb, nc._error_cb)
    while not sub._pending_queue.empty():
        synchronous.put_nowait(sub._pending_queue.get_nowait())
    sub._pending_queue = synchronous  # type: ignore[assignment]
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
    transport = nc._transport
    if nc._pending or transport is None or nc._status != NATS.CONNECTED:
        return False
    if nc._flush_queue is None or not nc._flush_queue.empty():
        return False
    parts, _ = _commands(nc, messages)
    transport.writelines(parts)
    return True


async def publish_all(nc: NATS, messages: list[Outgoing]) -> None:
    """Publish `messages` in order, with one flush: what `nc.publish` does for
    each, less its per-call cost (subject validation, a command built by copying the payload, a
    flusher wake-up per message). While reconnecting it is `nc.publish` (its buffering rules)."""
    if not nc.is_connected:
        for subject, payload, reply in messages:
            await nc.publish(subject, payload, reply=reply)
        return
    if nc.is_closed:
        raise nats.errors.ConnectionClosedError
    if nc.is_draining_pubs:
        raise nats.errors.ConnectionDrainingError
    parts, size = _commands(nc, messages)
    nc._pending += parts
    nc._pending_data_size += size
    if 0 < nc._max_pending_size < nc._pending_data_size:
        await nc._flush_pending(force_flush=True)
    elif nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()


def _plain(subject: str) -> bool:
    return subject.isprintable() and " " not in subject


def _commands(nc: NATS, messages: list[Outgoing]) -> tuple[list[bytes], int]:
    """The PUB commands of `messages` as parts for `writelines` (the payloads are not copied), and
    their size; nothing when one of them cannot go."""
    for subject, payload, reply in messages:
        # what nats-py's validation guards: a space or control character would break the PUB line
        if not subject or not _plain(subject) or (reply and not _plain(reply)):
            raise nats.errors.BadSubjectError
        if len(payload) > nc._max_payload:
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
        nc.stats["out_msgs"] += 1
        nc.stats["out_bytes"] += len(payload)
    return parts, size

"""The fence around nats-py's private internals: every use of them in Shoal is in this module.

Shoal relies on nats-py 2.16's internals where its public API costs too much on the hot path
(shared/bus/hot_path.py: a subscription's callback run as its message is read, without its
queue and task; PUB frames written to the socket at once, without the flusher's wake-up;
docs/performance.md) or says nothing (a cluster's size, a KV watch's consumer, a bucket's name).
pyproject.toml pins the nats-py line this was tested with; `missing()` names whatever an installed
nats-py lacks of `RELIED_ON`, and tests/shared/bus/test_nats_internals.py fails with those names.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.aio.transport import Transport
from nats.js.kv import KeyValue

from shared import private_internals
from shared.bus import eager

ErrorCallback = Callable[[Exception], Awaitable[None]]

# what this module reads, writes or calls, by the class it belongs to
RELIED_ON: dict[type, tuple[str, ...]] = {
    NATS: (
        "_transport",  # the socket, written to directly
        "_pending",  # nats-py's buffer of commands waiting for its flusher
        "_pending_data_size",
        "_max_pending_size",
        "_flush_queue",  # the flusher's queue: empty when no flush is under way
        "_flush_pending",  # wakes the flusher (force_flush: at once)
        "_status",
        "_error_cb",
        "_server_info",  # the server's INFO (connect_urls, cluster)
    ),
    Subscription: (
        "_pending_queue",  # where `Client._process_msg` puts each message (put_nowait)
        "_pending_size",  # its slow-consumer accounting
        "_wait_for_msgs_task",  # the task that reads `_pending_queue`
    ),
    KeyValue: ("_name", "_js", "_stream", "_pre"),  # purge_key: its stream, by subject
    KeyValue.KeyWatcher: ("_sub",),  # its JetStream subscription (consumer_info)
}
# code of nats-py's that must still do what this module expects of it: (function, text it contains)
BEHAVIOUR: tuple[private_internals.Behaviour, ...] = (
    (NATS._process_msg, "sub._pending_queue.put_nowait(msg)"),
    (NATS._process_msg, "sub._pending_size += payload_size"),
    (NATS._flush_pending, "force_flush"),
)


def missing() -> list[str]:
    """What the installed nats-py lacks of `RELIED_ON` and `BEHAVIOUR`, by name: [] when nothing."""
    return private_internals.missing(RELIED_ON, BEHAVIOUR)


# -- subscriptions: the callback runs as its message is read ------------------------------------
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


def run_inline(nc: NATS, sub: Subscription, cb: Callable[[Msg], Awaitable[None]]) -> None:
    """`sub`'s messages go to `cb` as they are read, not through its queue and task."""
    _replace_queue(sub, _Inline(sub, cb, nc._error_cb))


def run_synchronously(nc: NATS, sub: Subscription, cb: Callable[[Msg], None]) -> None:
    """`sub`'s messages go to the plain function `cb` as they are read."""
    _replace_queue(sub, _Synchronous(sub, cb, nc._error_cb))


def _replace_queue(sub: Subscription, queue: _Inline | _Synchronous) -> None:
    task = sub._wait_for_msgs_task
    if task is not None:  # never started: nothing can arrive before the SUB reaches the server
        task.cancel()
    while not sub._pending_queue.empty():  # defensive: hand over anything already queued
        queue.put_nowait(sub._pending_queue.get_nowait())
    sub._pending_queue = queue  # type: ignore[assignment]


# -- publishing: frames to the socket, or behind nats-py's buffer -------------------------------
def writable(nc: NATS) -> Transport | None:
    """The socket, when frames written to it now go out in order: connected, nothing waiting in
    nats-py's buffer and no flush under way. None otherwise."""
    transport = nc._transport
    if nc._pending or transport is None or nc._status != NATS.CONNECTED:
        return None
    if nc._flush_queue is None or not nc._flush_queue.empty():
        return None
    return transport


def drop_transport(nc: NATS) -> None:
    """Close the socket of a client whose first connect was ended by its error callback (a server
    that refused it): nats-py leaves it open, and nothing public closes it."""
    if nc._transport is not None:
        nc._transport.close()  # type: ignore[no-untyped-call]  # nats-py leaves it untyped


async def buffer(nc: NATS, parts: list[bytes], size: int) -> None:
    """Frames (`size` bytes in all) appended to nats-py's buffer, and its flusher woken as
    `nc.publish` wakes it (at once when the buffer is over its limit)."""
    nc._pending += parts
    nc._pending_data_size += size
    if 0 < nc._max_pending_size < nc._pending_data_size:
        await nc._flush_pending(force_flush=True)
    elif nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()


def buffer_for_this_turn(nc: NATS, parts: list[bytes], size: int) -> bool:
    """Frames (`size` bytes in all) appended to nats-py's buffer, and the buffer written to the
    socket once, at the end of this turn of the event loop (by `_write_buffer`, not nats-py's
    flusher task): what a process publishes in one turn leaves in one write, in the order it was
    published, `nc.publish`'s messages included. False (nothing buffered) when not connected or
    the buffer is over its limit: `buffer` then does what nats-py does."""
    if nc._status != NATS.CONNECTED or nc._transport is None:
        return False
    if 0 < nc._max_pending_size < nc._pending_data_size + size:
        return False
    nc._pending += parts
    nc._pending_data_size += size
    if nc not in _write_scheduled:
        _write_scheduled.add(nc)
        asyncio.get_running_loop().call_soon(_write_buffer, nc)
    return True


_write_scheduled: set[NATS] = set()


def _write_buffer(nc: NATS) -> None:
    """Everything in nats-py's buffer to the socket in one write (nats-py's own flusher, if it runs
    later, finds it empty). Writing all of the buffer keeps the order: what went before is in the
    socket already. While not connected nats-py keeps the buffer for after the reconnect."""
    _write_scheduled.discard(nc)
    transport = nc._transport
    if not nc._pending or transport is None or nc._status != NATS.CONNECTED:
        return
    transport.writelines(nc._pending)
    nc._pending = []
    nc._pending_data_size = 0


async def flush_buffer(nc: NATS) -> None:
    """What nats-py's buffer holds, written out now (`nc.flush()`'s PING can overtake it)."""
    await nc._flush_pending(force_flush=True)


# -- what the public API does not say ----------------------------------------------------------
def server_info(nc: NATS) -> dict[str, Any]:
    """The INFO of the server this connection is on ({} before it connects)."""
    return getattr(nc, "_server_info", None) or {}


def bucket_name(kv: KeyValue) -> str:
    return kv._name


async def purge_key(kv: KeyValue, key: str, before: int) -> None:
    """Remove from a bucket's stream every message of `key` below sequence `before` (what comes
    after stays): nats-py's KV API purges only to a marker that stays for ever."""
    await kv._js.purge_stream(kv._stream, seq=before, subject=f"{kv._pre}{key}")


async def check_watch_consumer(watcher: KeyValue.KeyWatcher) -> None:
    """Raises when the JetStream consumer behind a KV watch is gone (or its node unreachable)."""
    await watcher._sub.consumer_info()

"""Connecting to NATS and the JetStream KV buckets of the control plane."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import msgspec
import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.errors import BucketNotFoundError, NoStreamResponseError
from nats.js.kv import KeyValue

from shared import eager

T = TypeVar("T")
ErrorCallback = Callable[[Exception], Awaitable[None]]
_reconnects: weakref.WeakKeyDictionary[NATS, int] = weakref.WeakKeyDictionary()  # per connection
Listener = Callable[[], object]
# per connection: (called when it is lost, called when it is back), for those that must act on both
_listeners: weakref.WeakKeyDictionary[NATS, list[tuple[Listener, Listener]]] = weakref.WeakKeyDictionary()
log = logging.getLogger(__name__)


class _Outage:
    """nats-py calls the error callback on every failed reconnect attempt (twice a second while
    the server is down): log the first error of an outage, then stay quiet until reconnected."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.down = False
        self.reported = False

    async def error(self, exc: Exception) -> None:
        if self.down and self.reported:
            log.debug("nats error while reconnecting: %s", exc)
            return
        self.reported = self.down
        # a lost connection is expected news, not a bug: no traceback for it
        expected = isinstance(exc, (OSError, nats.errors.UnexpectedEOF, nats.errors.StaleConnectionError))
        log.error("nats error: %s", exc or type(exc).__name__, exc_info=None if self.down or expected else exc)

    async def disconnected(self) -> None:
        if not self.down:
            log.warning("disconnected from nats; reconnecting")
        self.down, self.reported = True, False


async def connect(url: str, name: str) -> NATS:
    """A named connection (visible in nats-server's /connz) that reconnects forever, to any of
    the comma-separated servers in `url` (and the cluster members the server announces)."""
    outage = _Outage(name)
    holder: list[NATS] = []

    async def disconnected_cb() -> None:
        # nats-py calls this on a close we asked for too (drain at shutdown): only a lost connection warns
        if holder and holder[0].is_closed:
            log.debug("disconnected from nats (closing)")
        else:
            await outage.disconnected()
            for lost, _ in _listeners.get(holder[0], []) if holder else []:
                lost()

    async def reconnected_cb() -> None:
        outage.down = False
        url = holder[0].connected_url if holder else None
        log.info("reconnected to nats at %s", url.netloc if url else "?")
        if holder:  # watches restart: see `watch`
            _reconnects[holder[0]] = reconnects(holder[0]) + 1  # nats-py has no such counter
            for _, back in _listeners.get(holder[0], []):
                back()

    nc = await nats.connect(
        servers=[u.strip() for u in url.split(",") if u.strip()],
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=2,
        allow_reconnect=True,
        error_cb=outage.error,
        disconnected_cb=disconnected_cb,
        reconnected_cb=reconnected_cb,
        pending_size=8 * 1024 * 1024,
    )
    holder.append(nc)
    return nc


def on_connection(nc: NATS, lost: Listener, back: Listener) -> None:
    """`lost()` when `nc` (made by `connect`) loses its server, `back()` once it has reconnected
    (its subscriptions restored; what was published meanwhile is flushed after that)."""
    _listeners.setdefault(nc, []).append((lost, back))


def cluster_size(nc: NATS) -> int:
    """Servers in the NATS cluster this connection is on: the server announces the client URLs
    of its cluster peers (`connect_urls` in INFO), itself included."""
    info = getattr(nc, "_server_info", None) or {}
    urls = set(info.get("connect_urls") or [])
    if info.get("cluster") and not urls:
        return 1
    return max(1, len(urls))


def kv_replicas(nc: NATS) -> int:
    """Replicas of each control-plane KV bucket: SHOAL_KV_REPLICAS, else 3 in a cluster of three
    or more servers (one node lost keeps a quorum), else the cluster size (1 for one server)."""
    configured = os.environ.get("SHOAL_KV_REPLICAS", "").strip()
    if configured:
        return max(1, int(configured))
    return min(3, cluster_size(nc))


async def bucket(nc: NATS, name: str, ttl: float | None = None) -> KeyValue:
    """Open a KV bucket, creating it if needed (`ttl`: entries not renewed expire)."""
    js = nc.jetstream()
    replicas = kv_replicas(nc)
    for _ in range(100):
        try:
            return await js.key_value(name)
        except BucketNotFoundError:
            try:
                # file storage: the control plane survives a nats-server restart; replicas: a node loss
                return await js.create_key_value(bucket=name, history=1, storage="file", ttl=ttl, replicas=replicas)
            except Exception as exc:  # created concurrently by another service
                log.debug("create bucket %s: %s", name, exc)
        except Exception as exc:  # JetStream still starting
            log.debug("open bucket %s: %s", name, exc)
        await asyncio.sleep(0.1)
    raise RuntimeError(f"cannot open JetStream KV bucket '{name}'")


LEADERLESS_S = 15.0  # how long a KV write waits for its stream to have a leader again


async def put(kv: KeyValue, key: str, value: bytes) -> int:
    """`kv.put`, waiting out a stream without a leader (after the loss of the NATS node that led
    it the others elect one within seconds: "no responders" / "no response from stream" meanwhile)."""
    return await _leader_patient(lambda: kv.put(key, value))


async def delete(kv: KeyValue, key: str) -> None:
    """`kv.delete`, waiting out a stream without a leader as `put` does."""
    await _leader_patient(lambda: kv.delete(key))


async def _leader_patient(write: Callable[[], Awaitable[T]]) -> T:
    deadline = asyncio.get_running_loop().time() + LEADERLESS_S
    while True:
        try:
            return await write()
        except (nats.errors.NoRespondersError, NoStreamResponseError, nats.errors.TimeoutError):
            if asyncio.get_running_loop().time() > deadline:
                raise
            log.info("a KV stream has no leader yet; writing again")
            await asyncio.sleep(0.25)


KEYS_CONSUMER_IDLE_S = 5.0


async def keys(kv: KeyValue) -> list[str]:
    """The bucket's keys ([] when empty, or when the bus is away: `list_keys` tells the two apart)."""
    try:
        return await list_keys(kv)
    except Exception:
        return []


async def list_keys(kv: KeyValue) -> list[str]:
    """The bucket's keys; raises when they cannot be listed. nats-py's `kv.keys()` lists them
    through an ephemeral consumer the server keeps for 5 minutes after use, and passes no
    setting through: called every second (leases), hundreds piled up in nats-server
    (benchmarks/load_cycles.py). Here the consumer goes 5 s after use."""
    watcher = await kv.watchall(ignore_deletes=True, meta_only=True, inactive_threshold=KEYS_CONSUMER_IDLE_S)
    found: list[str] = []
    try:
        async for entry in watcher:
            if not entry:  # the end of the current values
                break
            found.append(entry.key)
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()  # type: ignore[no-untyped-call]
    return found


@dataclass(frozen=True)
class Change:
    key: str  # "" marks the end of the current values (what existed when watching began)
    value: bytes | None  # None: deleted
    revision: int = 0


async def watch(nc: NATS, kv: KeyValue) -> AsyncIterator[Change]:
    """Every current entry, then every change, for ever: across NATS restarts too.

    nats-py's KV watcher does not survive a server restart (its ordered consumer is not
    recreated), so after a reconnect the watch starts again and replays the current
    values; consumers apply them idempotently.
    """
    while True:
        generation = reconnects(nc)
        try:
            watcher = await kv.watchall()
        except Exception as exc:  # JetStream still recovering after a restart
            log.debug("watch %s: %s", kv._name, exc)
            await asyncio.sleep(0.2)
            continue
        checked = time.monotonic()
        try:
            while reconnects(nc) == generation:
                try:
                    entry = await watcher.updates(timeout=1.0)  # type: ignore[no-untyped-call]
                except nats.errors.TimeoutError:
                    if time.monotonic() - checked >= WATCH_CHECK_S:
                        if not await _consumer_alive(watcher):
                            break
                        checked = time.monotonic()
                    continue
                if entry is None:
                    yield Change("", None)
                    continue
                deleted = entry.operation in ("DEL", "PURGE")
                yield Change(entry.key, None if deleted else entry.value, entry.revision or 0)
        finally:
            try:
                await watcher.stop()  # type: ignore[no-untyped-call]
            except Exception:
                pass
        log.info("watching %s again after a reconnect or the loss of its consumer", kv._name)


WATCH_CHECK_S = 2.0  # an idle watch checks this often that its JetStream consumer still exists


async def _consumer_alive(watcher: Any) -> bool:
    """Whether the ordered consumer behind a KV watch still exists. It lives on one NATS node:
    when that node dies while this connection is on another, nothing arrives, and nats-py
    recreates it only after two missed idle heartbeats (10 s, more while the stream has no
    leader): a load right after a node loss waited 17 s for the repository to see the worker's
    READY, and a gateway's `ready` stayed false 15 s after the load's answer
    (test_losing_one_of_three_nats_nodes_under_load, docs/reliability.md)."""
    try:
        await watcher._sub.consumer_info()
    except Exception as exc:  # gone, or its node unreachable: watch again (a replay is idempotent)
        log.info("the consumer of a KV watch is gone (%s)", type(exc).__name__)
        return False
    return True


def decode(decoder: msgspec.msgpack.Decoder[T], msg: Msg, logger: logging.Logger = log) -> T | None:
    """A message's payload decoded, or None (logged) when it does not decode: a bad message
    must never take a subscription down."""
    try:
        return decoder.decode(msg.data)
    except msgspec.DecodeError as exc:
        logger.error("undecodable message on %s: %s", msg.subject, exc)
        return None


async def gather(
    nc: NATS, subject: str, payload: bytes = b"", expected: int = 0, timeout: float = 5.0, settle: float = 0.015
) -> list[bytes]:
    """Ask every responder (scheduler replicas) and collect their answers.

    Returns as soon as `expected` answers are in; otherwise, after the first answer, once
    `settle` seconds pass without another. No answer within `timeout`: an empty list."""
    inbox = nc.new_inbox()
    replies: list[bytes] = []
    arrived = asyncio.Event()

    async def collect(msg: Msg) -> None:
        if not (msg.headers and msg.headers.get("Status") == "503"):  # no responders
            replies.append(msg.data)
        arrived.set()

    sub = await nc.subscribe(inbox, cb=collect)
    try:
        await nc.publish(subject, payload, reply=inbox)
        try:
            await asyncio.wait_for(arrived.wait(), timeout)
        except asyncio.TimeoutError:
            return replies
        while not (expected and len(replies) >= expected):
            arrived.clear()
            try:
                await asyncio.wait_for(arrived.wait(), settle)
            except asyncio.TimeoutError:
                break
        return replies
    finally:
        await sub.unsubscribe()


def reconnects(nc: NATS) -> int:
    return _reconnects.get(nc, 0)


async def settled(nc: NATS) -> None:
    """Everything this connection queued (its subscriptions too) has reached the server.

    `nc.flush()` alone does not say so: nats-py 2.16 writes its PING straight to the socket,
    ahead of commands still waiting for its flusher task, so the PONG can come back before a
    SUB sent just before it is registered (another connection's publish then finds no one)."""
    await nc._flush_pending(force_flush=True)
    await nc.flush()


class _Inline:
    """Stands in for a nats-py subscription's pending queue: `_process_msg` hands each message
    to `put_nowait`, which runs the callback at once (shared/eager.py) instead of waking the
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
    batch, whose subjects are built by `shared.subjects`."""
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

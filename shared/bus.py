"""Connecting to NATS and the JetStream KV buckets of the control plane."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TypeVar

import msgspec
import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

T = TypeVar("T")
_reconnects: weakref.WeakKeyDictionary[NATS, int] = weakref.WeakKeyDictionary()  # per connection
log = logging.getLogger(__name__)


async def connect(url: str, name: str) -> NATS:
    """A named connection (visible in nats-server's /connz) that reconnects forever."""

    async def error_cb(exc: Exception) -> None:
        log.error("nats error: %s", exc, exc_info=exc)

    holder: list[NATS] = []

    async def disconnected_cb() -> None:
        # nats-py calls this on a close we asked for too (drain at shutdown): only a lost connection warns
        if holder and holder[0].is_closed:
            log.debug("disconnected from nats (closing)")
        else:
            log.warning("disconnected from nats")

    async def reconnected_cb() -> None:
        log.info("reconnected to nats")
        if holder:  # watches restart: see `watch`
            _reconnects[holder[0]] = reconnects(holder[0]) + 1  # nats-py has no such counter

    nc = await nats.connect(
        servers=[u.strip() for u in url.split(",") if u.strip()],
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=2,
        allow_reconnect=True,
        error_cb=error_cb,
        disconnected_cb=disconnected_cb,
        reconnected_cb=reconnected_cb,
        pending_size=8 * 1024 * 1024,
    )
    holder.append(nc)
    return nc


async def bucket(nc: NATS, name: str, ttl: float | None = None) -> KeyValue:
    """Open a KV bucket, creating it if needed (`ttl`: entries not renewed expire)."""
    js = nc.jetstream()
    for _ in range(50):
        try:
            return await js.key_value(name)
        except BucketNotFoundError:
            try:
                # file storage: the control plane survives a nats-server restart
                return await js.create_key_value(bucket=name, history=1, storage="file", ttl=ttl)
            except Exception as exc:  # created concurrently by another service
                log.debug("create bucket %s: %s", name, exc)
        except Exception as exc:  # JetStream still starting
            log.debug("open bucket %s: %s", name, exc)
        await asyncio.sleep(0.1)
    raise RuntimeError(f"cannot open JetStream KV bucket '{name}'")


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
        try:
            while reconnects(nc) == generation:
                try:
                    entry = await watcher.updates(timeout=1.0)  # type: ignore[no-untyped-call]
                except nats.errors.TimeoutError:
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
        log.info("watching %s again after a reconnect", kv._name)


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

"""Connecting to NATS and the JetStream KV buckets of the control plane."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import nats
from nats.aio.client import Client as NATS
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

log = logging.getLogger(__name__)


async def connect(url: str, name: str) -> NATS:
    """A named connection (visible in nats-server's /connz) that reconnects forever."""

    async def error_cb(exc: Exception) -> None:
        log.error("nats error: %s", exc, exc_info=exc)

    async def disconnected_cb() -> None:
        log.warning("disconnected from nats")

    async def reconnected_cb() -> None:
        log.info("reconnected to nats")

    return await nats.connect(
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


async def bucket(nc: NATS, name: str) -> KeyValue:
    """Open a KV bucket, creating it (in memory: it is rebuilt on restart) if needed."""
    js = nc.jetstream()
    for _ in range(50):
        try:
            return await js.key_value(name)
        except BucketNotFoundError:
            try:
                return await js.create_key_value(bucket=name, history=1, storage="memory")
            except Exception as exc:  # created concurrently by another service
                log.debug("create bucket %s: %s", name, exc)
        except Exception as exc:  # JetStream still starting
            log.debug("open bucket %s: %s", name, exc)
        await asyncio.sleep(0.1)
    raise RuntimeError(f"cannot open JetStream KV bucket '{name}'")


async def watch(kv: KeyValue) -> AsyncIterator[tuple[str, bytes | None]]:
    """Yield (key, value) for every current entry and every later change; value None = deleted."""
    watcher = await kv.watchall()
    async for entry in watcher:
        if entry is None:  # end of the initial values
            continue
        deleted = entry.operation in ("DEL", "PURGE")
        yield entry.key, None if deleted else entry.value

"""The JetStream KV buckets of the control plane: opened, written across a leader change, listed and watched."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

import nats
from nats.aio.client import Client as NATS
from nats.js.errors import BucketNotFoundError, NoStreamResponseError
from nats.js.kv import KeyValue

from shared.bus import nats_internals
from shared.bus.connection import cluster_size, reconnects
from shared.bus.patience import patiently

T = TypeVar("T")
log = logging.getLogger(__name__)


def kv_replicas(nc: NATS) -> int:
    """Replicas of each control-plane KV bucket: SHOAL_KV_REPLICAS, else 3 in a cluster of three
    or more servers (one node lost keeps a quorum), else the cluster size (1 for one server)."""
    configured = os.environ.get("SHOAL_KV_REPLICAS", "").strip()
    if configured:
        return max(1, int(configured))
    return min(3, cluster_size(nc))


async def bucket(nc: NATS, name: str, ttl: float | None = None, create: bool = True) -> KeyValue:
    """Open a KV bucket, creating it if needed (`ttl`: entries not renewed expire). `create=False`:
    a reader of a bucket another service writes (the models bucket is the repository's, and only it
    may create it: docs/security.md) waits for it instead, up to a minute."""
    js = nc.jetstream()
    replicas = kv_replicas(nc)
    for _ in range(100 if create else 600):
        try:
            return await js.key_value(name)
        except BucketNotFoundError:
            if not create:
                log.debug("bucket %s: not made yet", name)
                await asyncio.sleep(0.1)
                continue
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
    leaderless = (nats.errors.NoRespondersError, NoStreamResponseError, nats.errors.TimeoutError)
    return await patiently(write, leaderless, LEADERLESS_S, 0.25, 0.25, "a KV stream has no leader yet")


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


async def purge_old_markers(kv: KeyValue, older_than_s: float) -> int:
    """Remove the delete markers older than `older_than_s` from a bucket's stream, each with what
    came before it on its key (a key written again since keeps its new value): how many.

    A KV delete leaves a marker for ever; a bucket whose keys are made up each time (client shm
    regions named by a uuid) grows by one per delete without this (benchmarks/soak_resources.py).
    A watch that starts after a marker went no longer sees that key's delete, so markers are kept
    for longer than a watch is away."""
    now = datetime.now(timezone.utc)
    old = [e for e in await _markers(kv) if _age_s(e, now) >= older_than_s]
    for entry in old:
        await nats_internals.purge_key(kv, entry.key, before=(entry.revision or 0) + 1)
    return len(old)


def _age_s(entry: KeyValue.Entry, now: datetime) -> float:
    created: Any = entry.created  # the message's time in its stream: a datetime (nats-py types it int)
    return float((now - created).total_seconds())


async def _markers(kv: KeyValue) -> list[KeyValue.Entry]:
    watcher = await kv.watchall(meta_only=True, inactive_threshold=KEYS_CONSUMER_IDLE_S)
    found: list[KeyValue.Entry] = []
    try:
        async for entry in watcher:
            if not entry:  # the end of the current values
                break
            if entry.operation in ("DEL", "PURGE") and entry.created is not None:
                found.append(entry)
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
            log.debug("watch %s: %s", nats_internals.bucket_name(kv), exc)
            await asyncio.sleep(0.2)
            continue
        checked = time.monotonic()
        try:
            while reconnects(nc) == generation:
                try:
                    entry = await watcher.updates(timeout=WATCH_CHECK_S)  # type: ignore[no-untyped-call]
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
        log.info("watching %s again after a reconnect or the loss of its consumer", nats_internals.bucket_name(kv))


WATCH_CHECK_S = 2.0  # an idle watch checks this often that its JetStream consumer still exists


async def _consumer_alive(watcher: Any) -> bool:
    """Whether the ordered consumer behind a KV watch still exists. It lives on one NATS node:
    when that node dies while this connection is on another, nothing arrives, and nats-py
    recreates it only after two missed idle heartbeats (10 s, more while the stream has no
    leader): a load right after a node loss waited 17 s for the repository to see the worker's
    READY, and a gateway's `ready` stayed false 15 s after the load's answer
    (test_losing_one_of_three_nats_nodes_under_load, docs/reliability.md)."""
    try:
        await nats_internals.check_watch_consumer(watcher)
    except Exception as exc:  # gone, or its node unreachable: watch again (a replay is idempotent)
        log.info("the consumer of a KV watch is gone (%s)", type(exc).__name__)
        return False
    return True

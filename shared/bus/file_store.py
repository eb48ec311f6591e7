"""Model files in a JetStream object store, by content: one object per distinct file, named by its
SHA-256 (`sha256-<hex>`), chunked, replicated like the control plane's KV buckets.

The repository puts what a model version needs (services/repository/publishing.py); a worker on
any host fetches what it loads into its cache (services/worker/model_files.py). The bucket is a
standard NATS object store (`nats object ls shoal-model-files` lists it); the chunks of an object
are the messages on its chunk subject, in stream order.

A fetch writes the chunks to a file as they arrive and remembers the stream sequence of the last
one: a fetch cut short (the connection dropped, the node serving it died) goes on from the next
chunk, on a new consumer, up to `FETCH_ATTEMPTS` times; what is already on disk is not fetched
again, in this process or the next (`Partial`). The digest is checked at the end: the object's
name is the SHA-256 the repository published, and bytes that do not have it (an object replaced
behind the repository's back, docs/security.md "Model files") are refused and not kept.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import nats
from nats.aio.client import Client as NATS
from nats.js import api
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.object_store import ObjectStore

from shared.bus.buckets import kv_replicas
from shared.wire import subjects

log = logging.getLogger(__name__)

CHUNK_MAX = 1 << 20  # bytes per chunk (less the headroom under the server's max_payload)
FETCH_BATCH = 8  # chunks asked for at once
FETCH_STALL_S = 10.0  # no chunk for this long: the fetch starts again from the last one received
FETCH_ATTEMPTS = 5


class FetchError(Exception):
    """A file could not be fetched (its object is missing, the bus stayed away, its digest differs)."""


def object_name(digest: str) -> str:
    return f"sha256-{digest}"


def sha256_file(path: Path, block: int = 4 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


async def open_store(nc: NATS, create: bool = True) -> ObjectStore:
    """The bucket, created if needed (file storage, replicated as the KV buckets are); `create=False`:
    a worker, which may only read it (docs/security.md), waits for the repository to make it."""
    js = nc.jetstream()
    for _ in range(100):
        try:
            return await js.object_store(subjects.MODEL_FILES_BUCKET)
        except BucketNotFoundError:
            if not create:
                await asyncio.sleep(0.1)
                continue
            try:
                return await js.create_object_store(
                    subjects.MODEL_FILES_BUCKET,
                    config=api.ObjectStoreConfig(
                        description="Shoal model files, by SHA-256",
                        storage=api.StorageType.FILE,
                        replicas=kv_replicas(nc),
                    ),
                )
            except Exception as exc:  # created concurrently by another service
                log.debug("create object store: %s", exc)
        except Exception as exc:  # JetStream still starting
            log.debug("open object store: %s", exc)
        await asyncio.sleep(0.1)
    raise RuntimeError(f"cannot open the JetStream object store '{subjects.MODEL_FILES_BUCKET}'")


async def stored(store: ObjectStore, digest: str) -> api.ObjectInfo | None:
    try:
        info = await store.get_info(object_name(digest))
    except NotFoundError:
        return None
    return None if info.deleted else info


async def put(nc: NATS, store: ObjectStore, digest: str, path: Path) -> int:
    """Upload the file at `path` (whose SHA-256 is `digest`) unless it is there already; the bytes sent."""
    if await stored(store, digest) is not None:
        return 0
    chunk = max(64 << 10, min(CHUNK_MAX, nc.max_payload - (16 << 10)))
    meta = api.ObjectMeta(name=object_name(digest), options=api.ObjectMetaOptions(max_chunk_size=chunk))
    with open(path, "rb") as f:
        info = await store.put(object_name(digest), f, meta=meta)
    if info.digest != _nats_digest(digest):  # the file changed while it was read
        await store.delete(object_name(digest))
        raise FetchError(f"{path} changed while it was uploaded")
    return int(info.size or 0)


async def delete(store: ObjectStore, digest: str) -> None:
    try:
        await store.delete(object_name(digest))
    except NotFoundError:
        pass


async def digests(store: ObjectStore) -> list[str]:
    """The files in the store."""
    try:
        infos = await store.list()
    except NotFoundError:  # an empty bucket
        return []
    return [i.name.removeprefix("sha256-") for i in infos if i.name.startswith("sha256-") and not i.deleted]


def _nats_digest(hex_digest: str) -> str:
    return "SHA-256=" + base64.urlsafe_b64encode(bytes.fromhex(hex_digest)).decode()


@dataclass
class Partial:
    """A fetch in progress on disk: the bytes so far (`path`) and, beside them, the object's upload
    (nuid) and the stream sequence of the last chunk written, so that a later fetch goes on."""

    path: Path

    @property
    def marker(self) -> Path:
        return self.path.with_name(self.path.name + ".at")

    def resume_point(self, nuid: str) -> tuple[int, int]:
        """(bytes on disk, stream sequence of the last chunk) of this upload; (0, 0) to start over."""
        try:
            owner, sequence, size = self.marker.read_text().split()
            on_disk = self.path.stat().st_size
        except (OSError, ValueError):
            return 0, 0
        if owner != nuid or on_disk < int(size):
            return 0, 0
        return int(size), int(sequence)

    def mark(self, nuid: str, sequence: int, size: int) -> None:
        self.marker.write_text(f"{nuid} {sequence} {size}")

    def clear(self) -> None:
        for path in (self.path, self.marker):
            path.unlink(missing_ok=True)


Progress = Callable[[int, int], None]  # (bytes so far, total)


@dataclass
class _Progress:
    """A fetch's state, exact after every chunk: the bytes in the file (and in the digest) and the
    stream sequence of the last chunk, so that an attempt cut anywhere goes on from there."""

    out: BinaryIO
    hasher: Any
    size: int
    sequence: int
    received: int = 0  # bytes that came over the bus (a chunk sent again after a cut counts twice)


async def fetch(
    nc: NATS,
    store: ObjectStore,
    digest: str,
    partial: Partial,
    progress: Progress | None = None,
    size: int | None = None,
) -> int:
    """Fetch the file `digest` (of `size` bytes, when known) into `partial.path`, going on from what
    an earlier fetch left there; its digest checked. Returns the bytes that came over the bus for it
    now. FetchError when it cannot be had or is not what was published."""
    info = await stored(store, digest)
    if info is None:
        raise FetchError(f"file sha256:{digest} is not in the object store '{subjects.MODEL_FILES_BUCKET}'")
    total, nuid = int(info.size or 0), str(info.nuid)
    if size is not None and total != size:  # refused before a byte of it comes
        raise FetchError(
            f"the object store's copy of file sha256:{digest} has {total} bytes, not the {size} the repository "
            "published: refused"
        )
    size, sequence = partial.resume_point(nuid)
    hasher = hashlib.sha256()
    if size:  # the bytes already here count towards the digest
        with open(partial.path, "rb") as f:
            left = size
            while left and (block := f.read(min(4 << 20, left))):
                hasher.update(block)
                left -= len(block)
    attempts = 0
    with open(partial.path, "r+b" if size else "wb") as out:
        state = _Progress(out, hasher, size, sequence)
        while state.size < total:
            attempts += 1
            out.seek(state.size)
            out.truncate(state.size)  # a chunk half written when the attempt broke goes
            try:
                await _chunks(nc, nuid, state, total, partial, progress)
            except (nats.errors.Error, asyncio.TimeoutError, OSError) as exc:
                out.flush()
                partial.mark(nuid, state.sequence, state.size)
                if attempts >= FETCH_ATTEMPTS:
                    raise FetchError(
                        f"fetching file sha256:{digest} stopped at {state.size} of {total} bytes "
                        f"after {attempts} attempts: {exc or type(exc).__name__}"
                    ) from exc
                log.warning(
                    "fetch of sha256:%s stopped at %d of %d bytes (%s); going on", digest[:12], state.size, total, exc
                )
                await asyncio.sleep(min(2.0, 0.25 * attempts))
    if hasher.hexdigest() != digest or state.size != total:
        partial.clear()
        raise FetchError(
            f"the object store's copy of file sha256:{digest} does not match the SHA-256 the repository published "
            f"(its bytes have sha256:{hasher.hexdigest()}): refused"
        )
    partial.marker.unlink(missing_ok=True)
    return state.received


async def _chunks(
    nc: NATS, nuid: str, state: _Progress, total: int, partial: Partial, progress: Progress | None
) -> None:
    """The object's chunks after `state.sequence` (all of them from 0), appended until `total`
    bytes are there. Raises when it stalls or the bus goes."""
    js = nc.jetstream()
    subject = f"$O.{subjects.MODEL_FILES_BUCKET}.C.{nuid}"
    after = state.sequence
    config = api.ConsumerConfig(
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE if after else api.DeliverPolicy.ALL,
        opt_start_seq=after + 1 if after else None,
        ack_policy=api.AckPolicy.ALL,
        inactive_threshold=30.0,  # an abandoned fetch's consumer goes by itself
        mem_storage=True,
        num_replicas=1,
    )
    sub = await js.pull_subscribe(subject, stream=f"OBJ_{subjects.MODEL_FILES_BUCKET}", config=config)
    # a batch is written and hashed on a thread while the next one comes (hashlib lets go of the
    # GIL): at 100 MB the digest alone took a third of the fetch on the event loop
    writing: asyncio.Future[None] | None = None
    queued = 0  # bytes received and handed to the writer, not written yet
    try:
        while state.size + queued < total:
            messages = await sub.fetch(FETCH_BATCH, timeout=FETCH_STALL_S)
            if not messages:
                continue
            await messages[-1].ack()  # AckAll: every chunk up to it
            chunks = [(msg.data, msg.metadata.sequence.stream) for msg in messages]
            if writing is not None:
                await writing
                _written(state, partial, nuid, total, progress)
            queued = sum(len(data) for data, _ in chunks)
            writing = asyncio.ensure_future(asyncio.to_thread(_write, state, chunks))
        if writing is not None:
            await writing
            writing = None
            _written(state, partial, nuid, total, progress)
    finally:
        if writing is not None:  # the attempt broke: what came is written all the same (the state stays exact)
            with contextlib.suppress(Exception):
                await writing
        try:
            await sub.unsubscribe()
        except Exception as exc:  # the bus is away: the consumer expires by itself
            log.debug("ending a fetch consumer: %s", exc)


def _write(state: _Progress, chunks: list[tuple[bytes, int]]) -> None:
    """Append chunks to the file and the digest (on a thread); the state follows chunk by chunk."""
    for data, sequence in chunks:
        state.out.write(data)
        state.hasher.update(data)
        state.size += len(data)
        state.received += len(data)
        state.sequence = sequence
    state.out.flush()


def _written(state: _Progress, partial: Partial, nuid: str, total: int, progress: Progress | None) -> None:
    partial.mark(nuid, state.sequence, state.size)
    if progress is not None:
        progress(state.size, total)


def link_or_copy(source: Path, target: Path) -> None:
    """`target` as a hard link to `source` (the cache's file: no second copy), else a copy, readable
    by its owner only (the cache's files are: docs/security.md)."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
        os.chmod(target, 0o400)

"""A model version's files on this worker's host, fetched from NATS and cached.

With `--model-files=store` (the repository's default) a `ModelRecord` lists the files of the model's
directory it published into the JetStream object store (shared/bus/file_store.py), and a worker
loads from a copy of that directory on its own host, never from the repository's path: a worker
container needs only the NATS URL.

The cache (`--model-cache-dir`, by default ~/.cache/shoal/model-files) is shared by the workers of
one host (and their python model processes):

- `blobs/<sha256>`: each file once, whatever model or version names it, read-only, its digest
  checked when it was fetched; `partial/` holds fetches under way (a later fetch goes on from them);
- `trees/<digest of the file list>/`: a model directory as the repository has it, made of hard
  links to the blobs (copies where links cannot be made), built once under a temporary name and
  renamed into place, so that a directory there is always whole.

A blob is fetched under an exclusive lock of its own (`flock`): a second worker that needs it at the
same time waits for the first and then finds it there. A reload, a version change or a second
model naming the same file fetches only what is new.

Nothing is loaded unchecked (docs/security.md, "Model files"): a fetched file's bytes must have the
SHA-256 the record names, or the load fails (the object store's copy was replaced: nothing here
can mend that); a cached blob is checked before each use (hashed once per process,
verified_files.py), and one that changed on the host is thrown away and fetched again; a tree whose
files are not exactly the record's, each matching, is built again. The cache is 0700, its files
0400: only the worker's own user reads or changes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from nats.aio.client import Client as NATS
from nats.js.object_store import ObjectStore

from services.worker import verified_files
from shared.bus import file_store
from shared.process import cache_dirs
from shared.wire.records import ModelFile, ModelRecord

log = logging.getLogger("shoal.worker")


@dataclass
class Fetched:
    """Where a model version's directory is, and what getting it cost."""

    path: Path
    bytes_fetched: int = 0
    seconds: float = 0.0


def tree_digest(files: list[ModelFile]) -> str:
    listing = "\n".join(f"{f.path}\0{f.size}\0{f.digest}" for f in sorted(files, key=lambda f: f.path))
    return hashlib.sha256(listing.encode()).hexdigest()


class ModelFiles:
    def __init__(self, nc: NATS, cache_dir: str = "") -> None:
        self.nc = nc
        self.root = Path(cache_dir) if cache_dir else cache_dirs.model_files()
        self.verified = verified_files.Verified()
        self._store: ObjectStore | None = None
        self._locks: dict[str, asyncio.Lock] = {}  # in this process: one fetch per blob or tree

    async def directory(self, record: ModelRecord) -> Fetched:
        """The directory to load `record`'s generation from: the repository's path when the record
        lists no files (`--model-files=path`), else this host's copy of the files it lists, each
        checked against its digest."""
        if not record.files:
            return Fetched(Path(record.path))
        started = time.perf_counter()
        tree = self.root / "trees" / tree_digest(record.files)
        async with self._lock(tree.name):
            try:
                await asyncio.to_thread(cache_dirs.private_dir, self.root)
            except cache_dirs.NotPrivate as exc:
                raise file_store.FetchError(f"model '{record.name}': the model file cache {exc}") from None
            fetched = 0
            for file in await asyncio.to_thread(self._unverified, record.files):
                fetched += await self._blob(file, record.name)
            await asyncio.to_thread(self._ensure_tree, tree, record)
        seconds = time.perf_counter() - started
        if fetched:
            log.info(
                "model '%s': %d file(s), %.1f MiB fetched in %.0f ms",
                record.name,
                len(record.files),
                fetched / (1 << 20),
                seconds * 1000,
            )
        return Fetched(tree, fetched, seconds)

    def _lock(self, key: str) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    async def store(self) -> ObjectStore:
        if self._store is None:
            self._store = await file_store.open_store(self.nc, create=False)  # the repository makes it
        return self._store

    def _unverified(self, files: list[ModelFile]) -> list[ModelFile]:
        """The files whose blob is not here, or not what the record says (blocking: may hash)."""
        distinct = {f.digest: f for f in files}.values()
        return [f for f in distinct if not self.verified.check(self.root / "blobs" / f.digest, f.digest, f.size)]

    async def _blob(self, file: ModelFile, model: str) -> int:
        """The file in the cache, fetched unless another worker of the host just did; the bytes fetched."""
        blob = self.root / "blobs" / file.digest
        async with self._lock(file.digest), self._host_lock(file.digest):
            if await asyncio.to_thread(self.verified.check, blob, file.digest, file.size):
                return 0  # another worker of this host fetched it meanwhile
            if os.path.lexists(blob):
                log.warning(
                    "model '%s', file '%s': this host's cached copy does not match its SHA-256 (sha256:%s): "
                    "fetching it again",
                    model,
                    file.path,
                    file.digest,
                )
                blob.unlink()
            partial = file_store.Partial(self.root / "partial" / file.digest)
            partial.path.parent.mkdir(mode=0o700, exist_ok=True)
            try:
                fetched = await file_store.fetch(self.nc, await self.store(), file.digest, partial, size=file.size)
            except file_store.FetchError as exc:
                raise file_store.FetchError(f"model '{model}', file '{file.path}': {exc}") from None
            os.chmod(partial.path, 0o400)
            blob.parent.mkdir(mode=0o700, exist_ok=True)
            os.replace(partial.path, blob)
            self.verified.remember(blob, file.digest)  # its bytes were hashed as they came
            return fetched

    @contextlib.asynccontextmanager
    async def _host_lock(self, digest: str) -> AsyncIterator[None]:
        """Exclusive among the processes of this host that share the cache (the wait off the loop)."""
        locks = self.root / "locks"
        locks.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(locks / digest, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        try:
            await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _ensure_tree(self, tree: Path, record: ModelRecord) -> None:
        """`tree` holding exactly the record's files, each matching its digest: as found, or built
        again (blocking; the blobs are checked already)."""
        problem = ""
        for _ in range(2):
            if not tree.is_dir() or tree.is_symlink():
                _discard(tree)
                self._build(tree, record.files)
            problem = verified_files.tree_problem(tree, record.files, self.verified)
            if not problem:
                return
            log.warning(
                "model '%s': its directory in this host's cache changed (%s): building it again", record.name, problem
            )
            _discard(tree)
        raise file_store.FetchError(f"model '{record.name}': its directory in this host's cache: {problem}")

    def _build(self, tree: Path, files: list[ModelFile]) -> None:
        tree.parent.mkdir(mode=0o700, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f".{tree.name}-", dir=tree.parent))
        try:
            for file in files:
                if file.path.startswith("/") or ".." in file.path.split("/"):  # never outside the tree
                    raise ValueError(f"model file path '{file.path}' leaves the model's directory")
                target = building / file.path
                target.parent.mkdir(parents=True, exist_ok=True)
                file_store.link_or_copy(self.root / "blobs" / file.digest, target)
                # a link changes the blob's change time, not its bytes (checked a moment ago)
                self.verified.remember(target, file.digest)
            try:
                os.rename(building, tree)
            except OSError:  # another process of this host built it first
                if not tree.is_dir():
                    raise
        finally:
            if building.exists():
                shutil.rmtree(building, ignore_errors=True)


def _discard(tree: Path) -> None:
    """Take a model directory out of the cache: renamed away first, so that it is never seen half
    removed, and a process still reading from it keeps what it opened."""
    if not os.path.lexists(tree):
        return
    if tree.is_symlink() or not tree.is_dir():
        tree.unlink()
        return
    gone = Path(tempfile.mkdtemp(prefix=f".gone-{tree.name}-", dir=tree.parent))
    os.rename(tree, gone / tree.name)
    shutil.rmtree(gone, ignore_errors=True)

"""Model files into NATS, so that a worker on any host loads them (`--model-files=store`).

When a model version is loaded, the repository lists the files of the model's directory that the
hosted versions need (everything but the other versions' directories, hidden files and
`__pycache__`), hashes each (SHA-256; a file whose size, time and inode did not change is not read
again) and uploads those the object store does not hold yet (shared/bus/file_store.py). The list
goes into the model's record (`ModelRecord.files`); workers fetch and cache what it names
(services/worker/model_files.py). A reload uploads only what changed; a file shared by models or
versions is stored once.

Objects no record names any more (an unloaded model, a replaced file) are deleted once they have
been unnamed for two collections in a row (`COLLECT_EVERY_S` apart): a worker still fetching the
previous generation when it is replaced has that long to finish.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

from nats.aio.client import Client as NATS
from nats.js.object_store import ObjectStore

from shared.bus import file_store
from shared.wire.records import ModelFile, ModelRecord

log = logging.getLogger("shoal.repository")

COLLECT_EVERY_S = 60.0
SKIPPED = {"__pycache__"}

Stat = tuple[int, int, int]  # size, mtime_ns, inode


def model_files(model_dir: Path, versions: Iterable[int]) -> list[tuple[str, Path]]:
    """(relative path, file) for every file of the model's directory the `versions` need."""
    wanted = {str(v) for v in versions}
    found: list[tuple[str, Path]] = []
    for top in sorted(model_dir.iterdir()):
        if top.name.startswith(".") or top.name in SKIPPED:
            continue
        if top.is_dir() and top.name.isdigit() and top.name not in wanted:
            continue  # another version's directory
        if top.is_file():
            found.append((top.name, top))
            continue
        for root, dirs, names in os.walk(top, followlinks=True):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED)
            for name in sorted(names):
                if not name.startswith("."):
                    path = Path(root) / name
                    found.append((path.relative_to(model_dir).as_posix(), path))
    return found


class FilePublisher:
    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self._store: ObjectStore | None = None
        self._digests: dict[Path, tuple[Stat, str]] = {}  # file -> (its stat when hashed, SHA-256)
        self._unnamed: set[str] = set()  # digests no record named at the last collection

    async def store(self) -> ObjectStore:
        if self._store is None:
            self._store = await file_store.open_store(self.nc)
        return self._store

    async def publish(self, model_dir: Path, versions: Iterable[int]) -> list[ModelFile]:
        """The files the versions need, each in the object store; their list for the record."""
        started = time.perf_counter()
        listed = await asyncio.to_thread(self._hash_all, model_dir, list(versions))
        hashed = time.perf_counter()
        store = await self.store()
        sent = 0
        for file, path in listed:
            sent += await file_store.put(self.nc, store, file.digest, path)
        # logged when nothing was new too: the record that names them is written next (benchmarks wait for it)
        log.info(
            "model files of '%s': %d file(s), %.1f MiB uploaded (hashed in %.0f ms, sent in %.0f ms)",
            model_dir.name,
            len(listed),
            sent / (1 << 20),
            (hashed - started) * 1000,
            (time.perf_counter() - hashed) * 1000,
        )
        return [file for file, _ in listed]

    def _hash_all(self, model_dir: Path, versions: list[int]) -> list[tuple[ModelFile, Path]]:
        listed = []
        for relative, path in model_files(model_dir, versions):
            info = path.stat()
            stat = (info.st_size, info.st_mtime_ns, info.st_ino)
            known = self._digests.get(path)
            digest = known[1] if known is not None and known[0] == stat else file_store.sha256_file(path)
            self._digests[path] = (stat, digest)
            listed.append((ModelFile(relative, info.st_size, digest), path))
        return listed

    async def collect(self, records: Iterable[ModelRecord]) -> int:
        """Delete the objects that no record named at this collection nor the one before; how many."""
        named = {f.digest for r in records for f in (*r.files, *r.serving_files)}
        store = await self.store()
        unnamed = set(await file_store.digests(store)) - named
        gone = unnamed & self._unnamed
        for digest in gone:
            await file_store.delete(store, digest)
        self._unnamed = unnamed - gone
        if gone:
            log.info("removed %d model file(s) no model names any more from the object store", len(gone))
        return len(gone)

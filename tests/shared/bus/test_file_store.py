"""shared/bus/file_store.py against a real nats-server: files go in by content and come back
whole, in chunks; a fetch cut by the server's death goes on from where it stopped; what cannot be
had fails with a clear error."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import nats
import pytest

from shared.bus import connection, file_store
from shared.process.natsserver import NatsServer


def write(path: Path, size: int) -> str:
    data = os.urandom(size)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


async def test_a_file_goes_in_once_and_comes_back_whole(nats_server, tmp_path):
    nc = await nats.connect(nats_server.url)
    store = await file_store.open_store(nc)
    source = tmp_path / "model.onnx"
    digest = write(source, 3 * file_store.CHUNK_MAX + 12345)  # several chunks, the last one short
    assert await file_store.put(nc, store, digest, source) == source.stat().st_size
    assert await file_store.put(nc, store, digest, source) == 0  # by content: already there
    assert digest in await file_store.digests(store)
    partial = file_store.Partial(tmp_path / "fetched")
    seen: list[tuple[int, int]] = []
    fetched = await file_store.fetch(nc, store, digest, partial, lambda got, total: seen.append((got, total)))
    assert fetched == source.stat().st_size and partial.path.read_bytes() == source.read_bytes()
    assert seen[-1] == (fetched, fetched) and len(seen) >= 1
    assert not partial.marker.exists()
    await file_store.delete(store, digest)
    with pytest.raises(file_store.FetchError, match="is not in the object store"):
        await file_store.fetch(nc, store, digest, file_store.Partial(tmp_path / "again"))
    await nc.close()


async def test_an_empty_file(nats_server, tmp_path):
    nc = await nats.connect(nats_server.url)
    store = await file_store.open_store(nc)
    source = tmp_path / "empty"
    digest = write(source, 0)
    await file_store.put(nc, store, digest, source)
    partial = file_store.Partial(tmp_path / "fetched")
    assert await file_store.fetch(nc, store, digest, partial) == 0
    assert partial.path.read_bytes() == b""
    await nc.close()


async def test_a_fetch_cut_by_the_servers_death_goes_on_where_it_stopped(tmp_path):
    with NatsServer() as server:
        nc = await connection.connect(server.url, "test-fetch")
        store = await file_store.open_store(nc)
        source = tmp_path / "big"
        digest = write(source, 40 * file_store.CHUNK_MAX)
        await file_store.put(nc, store, digest, source)
        partial = file_store.Partial(tmp_path / "fetched")
        cut: list[int] = []

        def progress(got: int, total: int) -> None:
            if not cut and got > total // 3:  # a third in: the server dies and comes back (its store kept)
                cut.append(got)
                server.kill()
                server.start()

        fetched = await file_store.fetch(nc, store, digest, partial, progress)
        assert partial.path.read_bytes() == source.read_bytes()
        # what was on disk when the server died was not fetched again (a batch in flight may be)
        assert fetched <= source.stat().st_size + file_store.FETCH_BATCH * file_store.CHUNK_MAX
        await nc.close()


async def test_a_fetch_interrupted_for_good_fails_clearly_and_the_next_one_goes_on(tmp_path):
    with NatsServer() as server:
        nc = await connection.connect(server.url, "test-fetch")
        store = await file_store.open_store(nc)
        source = tmp_path / "big"
        digest = write(source, 24 * file_store.CHUNK_MAX)
        await file_store.put(nc, store, digest, source)
        partial = file_store.Partial(tmp_path / "fetched")
        stopped: list[int] = []

        def stop_it(got: int, total: int) -> None:
            if got > total // 2 and not stopped:
                stopped.append(got)
                raise OSError("the disk went away")  # as a failed write would

        original = file_store.FETCH_ATTEMPTS
        file_store.FETCH_ATTEMPTS = 1
        try:
            with pytest.raises(file_store.FetchError, match=r"stopped at \d+ of \d+ bytes after 1 attempts"):
                await file_store.fetch(nc, store, digest, partial, stop_it)
        finally:
            file_store.FETCH_ATTEMPTS = original
        size_left, _ = partial.resume_point(str((await file_store.stored(store, digest)).nuid))
        assert size_left > 0
        fetched = await file_store.fetch(nc, store, digest, partial)  # a later fetch: from there
        assert fetched == source.stat().st_size - size_left
        assert partial.path.read_bytes() == source.read_bytes()
        await nc.close()

"""services/worker/model_files.py against a real nats-server: a model version's directory rebuilt
on this host from NATS, fetched once for every worker sharing the cache, even at the same time."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import nats
import pytest

from services.repository.publishing import FilePublisher
from services.worker.model_files import ModelFiles
from shared.bus import file_store
from shared.wire.records import ModelFile, ModelRecord
from tests.files import next_tick


async def test_a_directory_rebuilt_from_nats_and_fetched_once_per_host(nats_server, tmp_path):
    model = tmp_path / "repo" / "m"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "m"')
    (model / "1" / "model.onnx").write_bytes(b"x" * (3 * file_store.CHUNK_MAX + 7))
    nc = await nats.connect(nats_server.url)
    record = ModelRecord("m", str(model), files=await FilePublisher(nc).publish(model, [1]))
    cache = tmp_path / "cache"
    # two workers of one host, loading at the same moment: one fetches, the other waits and finds it
    first, second = ModelFiles(nc, str(cache)), ModelFiles(nc, str(cache))
    got = await asyncio.gather(first.directory(record), second.directory(record))
    assert got[0].path == got[1].path and got[0].path != model
    # each file fetched once on the host; which worker fetched which is the locks' order (load decides)
    assert got[0].bytes_fetched + got[1].bytes_fetched == 3 * file_store.CHUNK_MAX + 7 + 9
    assert (got[0].path / "1" / "model.onnx").read_bytes() == (model / "1" / "model.onnx").read_bytes()
    again = await ModelFiles(nc, str(cache)).directory(record)  # a third worker later: all cached
    assert again.path == got[0].path and again.bytes_fetched == 0
    # without files (--model-files=path), the repository's own directory
    assert (await first.directory(ModelRecord("m", str(model)))).path == model
    await nc.close()


async def test_a_file_missing_from_the_store_fails_the_load_clearly(nats_server, tmp_path):
    nc = await nats.connect(nats_server.url)
    record = ModelRecord("m", "/nowhere", files=[ModelFile("1/model.onnx", 3, "ab" * 32)])
    with pytest.raises(file_store.FetchError, match=r"model 'm', file '1/model.onnx': .* is not in the object store"):
        await ModelFiles(nc, str(tmp_path / "cache")).directory(record)
    await nc.close()


async def published(nc, tmp_path, size: int = 2 * file_store.CHUNK_MAX + 5) -> ModelRecord:
    """A model version published by the repository; its content this test's own (the server is shared)."""
    data = os.urandom(size)
    model = tmp_path / "repo" / "m"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(f'name: "m" # {data.hex()[:16]}')
    (model / "1" / "model.onnx").write_bytes(data)
    return ModelRecord("m", str(model), files=await FilePublisher(nc).publish(model, [1]))


def weights(record: ModelRecord) -> ModelFile:
    return next(f for f in record.files if f.path == "1/model.onnx")


async def test_a_file_replaced_in_the_object_store_is_refused(nats_server, tmp_path):
    nc = await nats.connect(nats_server.url)
    record = await published(nc, tmp_path)
    store = await file_store.open_store(nc)
    file = weights(record)
    # behind the repository's back: other bytes under the name of the published digest
    await store.put(file_store.object_name(file.digest), b"v" * file.size)
    cache = tmp_path / "cache"
    with pytest.raises(
        file_store.FetchError,
        match=r"model 'm', file '1/model.onnx': the object store's copy of file sha256:\w+ does not match "
        r"the SHA-256 the repository published \(its bytes have sha256:\w+\): refused",
    ):
        await ModelFiles(nc, str(cache)).directory(record)
    assert not (cache / "blobs" / file.digest).exists() and not list((cache / "partial").iterdir())
    assert not (cache / "trees").exists()  # no directory to load from was made
    # of another size: refused before a byte of it is fetched
    await store.put(file_store.object_name(file.digest), b"v" * 10)
    with pytest.raises(file_store.FetchError, match=r"has 10 bytes, not the \d+ the repository published: refused"):
        await ModelFiles(nc, str(cache)).directory(record)
    await nc.close()


async def test_a_cached_file_changed_on_the_host_is_fetched_again(nats_server, tmp_path):
    nc = await nats.connect(nats_server.url)
    record = await published(nc, tmp_path)
    original = (Path(record.path) / "1" / "model.onnx").read_bytes()
    cache = tmp_path / "cache"
    worker = ModelFiles(nc, str(cache))
    tree = (await worker.directory(record)).path
    blob = cache / "blobs" / weights(record).digest
    for tamper in (blob, tree / "1" / "model.onnx"):  # the blob, or the tree's link to it (one inode)
        next_tick(tamper)
        os.chmod(tamper, 0o600)
        tamper.write_bytes(b"t" * len(original))  # same size: only its digest tells
        for loader in (worker, ModelFiles(nc, str(cache))):  # the worker that fetched it, and another
            again = await loader.directory(record)
            assert again.path == tree and (tree / "1" / "model.onnx").read_bytes() == original
            assert blob.read_bytes() == original
            if loader is worker:
                assert again.bytes_fetched == len(original)  # fetched again, then known
            else:
                assert again.bytes_fetched == 0
    await nc.close()


async def test_a_cached_directory_with_a_file_added_or_replaced_is_built_again(nats_server, tmp_path):
    nc = await nats.connect(nats_server.url)
    record = await published(nc, tmp_path, 5)
    cache = tmp_path / "cache"
    tree = (await ModelFiles(nc, str(cache)).directory(record)).path
    (tree / "1" / "extra.py").write_text("import os")  # a module a python model would import
    assert (await ModelFiles(nc, str(cache)).directory(record)).path == tree
    assert not (tree / "1" / "extra.py").exists()
    (tree / "config.pbtxt").unlink()  # its link replaced by another file
    (tree / "config.pbtxt").write_text('name: "other"')
    assert (await ModelFiles(nc, str(cache)).directory(record)).bytes_fetched == 0  # the blobs were fine
    assert (tree / "config.pbtxt").read_text().startswith('name: "m" #')
    await nc.close()


async def test_the_cache_is_its_users_only(nats_server, tmp_path):
    nc = await nats.connect(nats_server.url)
    record = await published(nc, tmp_path, 5)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    os.chmod(cache, 0o755)  # as an older Shoal (or a umask of 022) left it: tightened
    await ModelFiles(nc, str(cache)).directory(record)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE((cache / "blobs" / weights(record).digest).stat().st_mode) == 0o400
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in (cache / "locks").iterdir())
    if os.geteuid() == 0:  # only root can give the cache to another user
        os.chown(cache, 65534, 65534)
        with pytest.raises(file_store.FetchError, match=r"model 'm': the model file cache .* belongs to another user"):
            await ModelFiles(nc, str(cache)).directory(record)
    await nc.close()

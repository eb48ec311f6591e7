"""services/worker/model_files.py against a real nats-server: a model version's directory rebuilt
on this host from NATS, fetched once for every worker sharing the cache, even at the same time."""

from __future__ import annotations

import asyncio

import nats
import pytest

from services.repository.publishing import FilePublisher
from services.worker.model_files import ModelFiles
from shared.bus import file_store
from shared.wire.records import ModelFile, ModelRecord


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

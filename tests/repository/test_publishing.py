"""services/repository/publishing.py against a real nats-server: which files of a model's directory
go, each once by content, and objects no record names leave after two collections."""

from __future__ import annotations

import nats

from services.repository.publishing import FilePublisher, model_files
from shared.bus import file_store
from shared.wire.records import ModelRecord


def make_model(root):
    model = root / "m"
    (model / "1").mkdir(parents=True)
    (model / "2" / "sub").mkdir(parents=True)
    (model / "__pycache__").mkdir()
    (model / "config.pbtxt").write_text('name: "m"')
    (model / "1" / "model.onnx").write_bytes(b"one")
    (model / "2" / "model.onnx").write_bytes(b"two")
    (model / "2" / "sub" / "extra.bin").write_bytes(b"extra")
    (model / ".hidden").write_text("x")
    (model / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"pyc")
    return model


def test_the_files_the_hosted_versions_need(tmp_path):
    model = make_model(tmp_path)
    assert [r for r, _ in model_files(model, [2])] == ["2/model.onnx", "2/sub/extra.bin", "config.pbtxt"]
    assert [r for r, _ in model_files(model, [1, 2])][0] == "1/model.onnx"


async def test_published_once_by_content_and_collected_when_unnamed(nats_server, tmp_path):
    model = make_model(tmp_path)
    nc = await nats.connect(nats_server.url)
    publisher = FilePublisher(nc)
    files = await publisher.publish(model, [1])
    assert [f.path for f in files] == ["1/model.onnx", "config.pbtxt"]
    store = await publisher.store()
    assert {f.digest for f in files} <= set(await file_store.digests(store))
    (model / "1" / "model.onnx").write_bytes(b"one, changed")  # a reload: the new content goes too
    changed = await publisher.publish(model, [1])
    assert changed[0].digest != files[0].digest and changed[1] == files[1]
    record = ModelRecord("m", files=changed)
    assert await publisher.collect([record]) == 0  # the old file: unnamed once
    assert files[0].digest in await file_store.digests(store)
    assert await publisher.collect([record]) == 1  # unnamed twice: gone
    assert set(await file_store.digests(store)) >= {f.digest for f in changed}
    assert files[0].digest not in await file_store.digests(store)
    await nc.close()

"""Models loaded from files sent with the load request (Triton's file overrides) live in scratch
directories (shared/process/scratch.py): a reload retires the previous one once the new generation serves,
an unload removes it, and a stopping repository removes what is left."""

from __future__ import annotations

import base64
import json
import tempfile

import pytest
from onnx import TensorProto

from services.repository import examples
from services.repository.manager import ModelManager
from shared.process.settings import RepositorySettings
from shared.wire.records import ModelRecord


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return tmp_path


async def _publish(record: ModelRecord) -> None:
    """The repository service publishes to its KV bucket; here nothing reads the records."""


async def _forget(name: str) -> None:
    pass


async def _drain(name: str, version: int) -> None:
    pass


def overrides(tmp) -> tuple[str, dict[str, str]]:
    model = examples.write_model(tmp / "source", "m", examples.identity_graph(TensorProto.FLOAT, 2, "m"), None)
    onnx = (model / "1" / "model.onnx").read_bytes()
    config = {
        "name": "m",
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
    return json.dumps(config), {"1/model.onnx": base64.b64encode(onnx).decode()}


async def test_the_override_directories_go_with_a_stopping_repository(tmp):
    (tmp / "models").mkdir()
    settings = RepositorySettings(model_repository=str(tmp / "models"), model_control_mode="explicit")
    manager = ModelManager(settings, _publish, _forget, _drain)
    config, files = overrides(tmp)
    await manager.load("m", config, files)
    await manager.load("m", config, files)  # a reload: the first directory waits for the new generation
    made = sorted((tmp / "tmp").glob("shoal-override-m-*"))
    assert len(made) == 2
    manager.remove_override_dirs()
    assert list((tmp / "tmp").glob("shoal-override-*")) == []

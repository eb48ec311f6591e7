from __future__ import annotations

from pathlib import Path

from onnx import TensorProto

from services.repository import examples
from services.repository.scan import scan_model, select_versions
from shared.config import model_config as mc


def test_version_policies():
    latest = mc.parse_text("version_policy { latest { num_versions: 2 } }")
    assert select_versions(latest, [1, 2, 5]) == [2, 5]
    assert select_versions(mc.parse_text("version_policy { all { } }"), [1, 3]) == [1, 3]
    assert select_versions(mc.parse_text("version_policy { specific { versions: [1, 4] } }"), [1, 2, 3]) == [1]
    assert select_versions(mc.parse_text(""), [1, 2]) == [2]


def test_autocomplete_and_versions(tmp_path: Path):
    examples.write_model(tmp_path, "auto", examples.simple_graph(), None, version=3)
    (tmp_path / "auto" / "notaversion").mkdir()
    scanned = scan_model(tmp_path / "auto")
    assert scanned.error == "" and scanned.versions == [3]
    doc = mc.to_json(scanned.config)
    assert doc["max_batch_size"] == 4 and doc["platform"] == "onnxruntime_onnx"
    assert [o["name"] for o in doc["output"]] == ["OUTPUT0", "OUTPUT1"]


def test_non_batching_onnx_with_max_batch_size_fails(tmp_path: Path):
    graph = examples.identity_graph(TensorProto.FLOAT, 2)
    graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2  # fixed first dim: cannot batch
    graph.output[0].type.tensor_type.shape.dim[0].dim_value = 2
    examples.write_model(tmp_path, "fixed", graph, 'max_batch_size: 4\nbackend: "onnxruntime"\n')
    scanned = scan_model(tmp_path / "fixed")
    assert scanned.config is None and "does not support batching" in scanned.error


def test_directory_name_must_match(tmp_path: Path):
    examples.write_model(tmp_path, "dir", examples.simple_graph(), 'name: "other"\n')
    assert "directory name must equal model name" in scan_model(tmp_path / "dir").error

"""A generated repository of many small models, for the many-models test and benchmark.

Identity ONNX models cycling through several datatypes (`m000_fp32`, `m001_int32`, ...),
plus a few ensembles over them and a few python models, as a large Triton repository mixes them.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from onnx import TensorProto

from services.repository import examples
from tests.cluster import identity_config

DATATYPES = {
    "FP32": TensorProto.FLOAT,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "UINT8": TensorProto.UINT8,
    "BOOL": TensorProto.BOOL,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}

PYTHON_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""


def onnx_name(index: int) -> str:
    datatype = list(DATATYPES)[index % len(DATATYPES)]
    return f"m{index:03d}_{datatype.lower()}"


def _ensemble_config(name: str, first: str, second: str) -> str:
    step = 'model_name: "{m}" model_version: -1 input_map {{ key: "INPUT0" value: "{i}" }} output_map {{ key: "OUTPUT0" value: "{o}" }}'
    return textwrap.dedent(
        f"""\
        name: "{name}"
        platform: "ensemble"
        max_batch_size: 8
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        ensemble_scheduling {{ step [
          {{ {step.format(m=first, i="INPUT0", o="mid")} }},
          {{ {step.format(m=second, i="mid", o="OUTPUT0")} }}
        ] }}
        """
    )


def write_many_models(root: Path, onnx_models: int, ensembles: int = 2, python_models: int = 2) -> list[str]:
    """Write the repository; the names of every model in it."""
    names = []
    for index in range(onnx_models):
        name = onnx_name(index)
        datatype = name.rsplit("_", 1)[1].upper()
        graph = examples.identity_graph(DATATYPES[datatype], 2, name)
        examples.write_model(root, name, graph, identity_config(name, datatype))
        names.append(name)
    fp32 = [n for n in names if n.endswith("_fp32")]
    for index in range(ensembles):
        name = f"ens{index:02d}"
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(_ensemble_config(name, fp32[index], fp32[index + 1]))
        names.append(name)
    for index in range(python_models):
        name = f"py{index:02d}"
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(PYTHON_MODEL)
        config = identity_config(name, "FP32").replace('backend: "onnxruntime"', 'backend: "python"')
        (root / name / "config.pbtxt").write_text(config)
        names.append(name)
    return names

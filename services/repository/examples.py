"""The example model repository, built locally with the `onnx` package (no downloads).

- `simple`: Triton's classic: INPUT0, INPUT1 INT32 [16] -> OUTPUT0 = sum, OUTPUT1 = difference.
- `identity_fp32`: FP32 [-1] -> the same tensor, dynamic batching.
- `mlp`: FP32 [256] -> 1024 -> 1024 -> 16 with ReLU, fixed seed, dynamic batching, 2 CPU instances.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]
IR_VERSION = 8  # readable by every onnxruntime from 1.14 on


def _save(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=OPSET, producer_name="shoal")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _io(name: str, elem: int, dims: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, dims)


def simple_graph() -> onnx.GraphProto:
    return helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "simple",
        [_io("INPUT0", TensorProto.INT32, ["batch", 16]), _io("INPUT1", TensorProto.INT32, ["batch", 16])],
        [_io("OUTPUT0", TensorProto.INT32, ["batch", 16]), _io("OUTPUT1", TensorProto.INT32, ["batch", 16])],
    )


def identity_graph(elem: int, rank: int = 2, name: str = "identity") -> onnx.GraphProto:
    dims = ["batch"] + [f"d{i}" for i in range(rank - 1)]
    return helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        name,
        [_io("INPUT0", elem, dims)],
        [_io("OUTPUT0", elem, dims)],
    )


def mlp_graph(seed: int = 0) -> onnx.GraphProto:
    rng = np.random.default_rng(seed)
    sizes = [256, 1024, 1024, 16]
    nodes, inits, current = [], [], "INPUT0"
    for layer, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
        weight = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        bias = (rng.standard_normal(fan_out) * 0.01).astype(np.float32)
        inits += [numpy_helper.from_array(weight, f"W{layer}"), numpy_helper.from_array(bias, f"B{layer}")]
        last = layer == len(sizes) - 2
        out = "OUTPUT0" if last else f"H{layer}"
        nodes.append(helper.make_node("Gemm", [current, f"W{layer}", f"B{layer}"], [out if last else f"Z{layer}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"Z{layer}"], [out]))
        current = out
    return helper.make_graph(
        nodes,
        "mlp",
        [_io("INPUT0", TensorProto.FLOAT, ["batch", 256])],
        [_io("OUTPUT0", TensorProto.FLOAT, ["batch", 16])],
        initializer=inits,
    )


SIMPLE_CONFIG = """name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

IDENTITY_CONFIG = """name: "identity_fp32"
backend: "onnxruntime"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

MLP_CONFIG = """name: "mlp"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


def write_model(root: Path, name: str, graph: onnx.GraphProto, config: str | None, version: int = 1) -> Path:
    model_dir = root / name
    _save(graph, model_dir / str(version) / "model.onnx")
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    return model_dir


def write_examples(root: Path) -> Path:
    """Write the example repository into `root` (created if missing); returns `root`."""
    root.mkdir(parents=True, exist_ok=True)
    write_model(root, "simple", simple_graph(), SIMPLE_CONFIG)
    write_model(root, "identity_fp32", identity_graph(TensorProto.FLOAT, 2, "identity_fp32"), IDENTITY_CONFIG)
    write_model(root, "mlp", mlp_graph(), MLP_CONFIG)
    return root

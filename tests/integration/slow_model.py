"""A model that takes a while, for the scheduling tests (rate limiter, scale-out, policies)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def slow_graph(size: int = 768, seed: int = 0) -> onnx.GraphProto:
    """FP32 [-1, 1] -> the same values, after a size x size matrix product that depends on the
    input (so it cannot be folded away): a model that takes a while, for scheduling tests."""
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.standard_normal((size, size)).astype(np.float32), "W")
    zero = numpy_helper.from_array(np.zeros((1,), np.float32), "ZERO")
    nodes = [
        helper.make_node("ReduceSum", ["INPUT0"], ["S"], keepdims=0),
        helper.make_node("Mul", ["W", "S"], ["WS"]),
        helper.make_node("MatMul", ["WS", "W"], ["P"]),
        helper.make_node("MatMul", ["P", "W"], ["Q"]),
        helper.make_node("ReduceSum", ["Q"], ["T"], keepdims=0),
        helper.make_node("Mul", ["T", "ZERO"], ["NOTHING"]),
        helper.make_node("Add", ["INPUT0", "NOTHING"], ["OUTPUT0"]),
    ]
    return helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 1])],
        initializer=[weight, zero],
    )

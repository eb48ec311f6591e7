#!/usr/bin/env python3
"""Generate the benchmark model repository (Triton layout) and the raw MLP ONNX file.

usage: python benchmarks/triton_models.py OUT_DIR [--ort-threads N] [--instances N] [--str]

Writes:
  OUT_DIR/repo/                    model repository for a Triton-compatible server
      simple/                      python backend, INT32 INPUT0/INPUT1 [16], max_batch_size 8,
                                   OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1
      identity_fp32/               python backend, FP32 INPUT0 [-1] -> OUTPUT0, max_batch_size 64,
                                   dynamic_batching {}
      mlp_onnx_py/                 python backend running 1/model.onnx with onnxruntime,
                                   max_batch_size 64, dynamic_batching {} (no queue delay)
      mlp_onnx_py_nobatch/         same, without dynamic_batching
      mlp_onnx_py_delay500/        same, dynamic_batching { max_queue_delay_microseconds: 500 }
  OUT_DIR/native_repo/mlp_onnx/    the identical ONNX model laid out for a native onnxruntime
                                   backend (platform onnxruntime_onnx), dynamic_batching {}
      text_recognition_py{,_dyn,_dyn2}/  with --str: the tutorial's text-recognition model (benchmarks/str_model.py)
                                   run by the same model.py: no batching, dynamic batching, and
                                   dynamic batching with two instances (max_batch_size 8)
  OUT_DIR/native_repo/text_recognition_onnx{,_dyn,_dyn2}/  the same ONNX for a native backend
  OUT_DIR/mlp.onnx                 raw ONNX file (same bytes as every copy above)
  OUT_DIR/mlp_reference.npz        one reference input/output pair (batch 4) for correctness checks

MLP: X[batch,256] fp32 -> MatMul(256x1024)+Add+Relu -> MatMul(1024x1024)+Add+Relu
     -> MatMul(1024x16)+Add -> Y[batch,16]; weights ~ N(0,1)/sqrt(fan_in), biases ~ 0.01*N(0,1),
     numpy default_rng(seed=0). ONNX opset 17, IR version 8 (loadable by older onnxruntime too).
"""

from __future__ import annotations

import argparse
import pathlib
import shutil

import numpy as np

MLP_IN, MLP_H1, MLP_H2, MLP_OUT = 256, 1024, 1024, 16


# ----------------------------------------------------------------------------- ONNX model
def make_mlp_onnx(path: pathlib.Path, seed: int = 0) -> dict[str, np.ndarray]:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    dims = [(MLP_IN, MLP_H1), (MLP_H1, MLP_H2), (MLP_H2, MLP_OUT)]
    weights: dict[str, np.ndarray] = {}
    for i, (fan_in, fan_out) in enumerate(dims, start=1):
        weights[f"W{i}"] = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        weights[f"B{i}"] = (0.01 * rng.standard_normal((fan_out,))).astype(np.float32)

    nodes = [
        helper.make_node("MatMul", ["INPUT0", "W1"], ["mm1"]),
        helper.make_node("Add", ["mm1", "B1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["h1"]),
        helper.make_node("MatMul", ["h1", "W2"], ["mm2"]),
        helper.make_node("Add", ["mm2", "B2"], ["a2"]),
        helper.make_node("Relu", ["a2"], ["h2"]),
        helper.make_node("MatMul", ["h2", "W3"], ["mm3"]),
        helper.make_node("Add", ["mm3", "B3"], ["OUTPUT0"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp_256_1024_1024_16",
        inputs=[helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", MLP_IN])],
        outputs=[helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", MLP_OUT])],
        initializer=[numpy_helper.from_array(v, name=k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="steering-bench")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return weights


def mlp_numpy(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    h = np.maximum(x @ w["W1"] + w["B1"], 0)
    h = np.maximum(h @ w["W2"] + w["B2"], 0)
    return h @ w["W3"] + w["B3"]


# ----------------------------------------------------------------------------- python models
SIMPLE_PY = '''\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.int32)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.int32)),
            ]))
        return responses
'''

IDENTITY_PY = '''\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0 (FP32, any length)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x)]))
        return responses
'''

# Runs the model.onnx beside it, whatever its input and output names (the MLP, the STR model)
ONNX_PY = '''\
import json
import os
import sys

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Runs model.onnx (next to this file) with onnxruntime on CPU.

    All requests handed to one execute() call (a dynamic batch) are concatenated
    along the batch axis, run in ONE session.run, and split back per request.
    """

    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        intra = int(params.get("intra_op_num_threads", "1"))
        inter = int(params.get("inter_op_num_threads", "1"))
        so = ort.SessionOptions()
        so.intra_op_num_threads = intra
        so.inter_op_num_threads = inter
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.onnx")
        self.sess = ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])
        self.in_name = self.sess.get_inputs()[0].name
        self.out_name = self.sess.get_outputs()[0].name
        pb_utils.Logger.log_info(
            f"{args['model_name']}: onnxruntime {ort.__version__} numpy {np.__version__} "
            f"python {sys.version.split()[0]} prefix {sys.prefix} intra_op={intra} inter_op={inter}")

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, self.in_name).as_numpy() for r in requests]
        x = xs[0] if len(xs) == 1 else np.concatenate(xs, axis=0)
        y = self.sess.run([self.out_name], {self.in_name: np.ascontiguousarray(x, dtype=np.float32)})[0]
        responses = []
        start = 0
        for xi in xs:
            n = xi.shape[0]
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(self.out_name, y[start:start + n])]))
            start += n
        return responses

    def finalize(self):
        self.sess = None
'''


def instance_group(count: int) -> str:
    return f"instance_group [{{ kind: KIND_CPU, count: {count} }}]\n"


def write_model(repo: pathlib.Path, name: str, config: str, files: dict[str, bytes | str]) -> None:
    d = repo / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    lines = [ln.strip() for ln in config.strip().splitlines() if ln.strip()]
    lines = [("  " + ln) if ln.startswith("{ name") else ln for ln in lines]
    (d / "config.pbtxt").write_text("\n".join(lines) + "\n")
    for fname, content in files.items():
        p = d / "1" / fname
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)


# The tutorial's three configurations (issue 23 item 4): suffix -> (dynamic batching, instances)
STR_CONFIGS = {"": ("", 1), "_dyn": ("dynamic_batching { }", 1), "_dyn2": ("dynamic_batching { }", 2)}


def write_str_models(repo: pathlib.Path, native: pathlib.Path, ort_threads: int) -> None:
    """text_recognition_py{,_dyn,_dyn2} (model.py + onnxruntime, both servers) and
    text_recognition_onnx{,_dyn,_dyn2} (a native onnxruntime backend on its defaults)."""
    from str_model import STR_CLASSES, STR_INPUT, STR_OUTPUT, STR_SEQ, STR_SHAPE, build_str

    onnx_bytes = build_str()
    io = f"""
        max_batch_size: 8
        input [ {{ name: "{STR_INPUT}", data_type: TYPE_FP32, dims: [ {", ".join(map(str, STR_SHAPE))} ] }} ]
        output [ {{ name: "{STR_OUTPUT}", data_type: TYPE_FP32, dims: [ {STR_SEQ}, {STR_CLASSES} ] }} ]"""
    params = f"""
        parameters {{ key: "intra_op_num_threads" value: {{ string_value: "{ort_threads}" }} }}
        parameters {{ key: "inter_op_num_threads" value: {{ string_value: "1" }} }}"""
    for suffix, (db, count) in STR_CONFIGS.items():
        name = f"text_recognition_py{suffix}"
        config = f"""
            name: "{name}"
            backend: "python"{io}
            {db}{params}
            {instance_group(count)}"""
        write_model(repo, name, config, {"model.py": ONNX_PY, "model.onnx": onnx_bytes})
        name = f"text_recognition_onnx{suffix}"
        config = f"""
            name: "{name}"
            platform: "onnxruntime_onnx"{io}
            {db}
            {instance_group(count)}"""
        write_model(native, name, config, {"model.onnx": onnx_bytes})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--ort-threads", type=int, default=1, help="onnxruntime intra_op_num_threads (default 1)")
    ap.add_argument("--instances", type=int, default=1, help="instance_group count for every model (default 1)")
    ap.add_argument("--str", action="store_true", help="also write the text-recognition models (~200 MB)")
    args = ap.parse_args()

    out: pathlib.Path = args.out
    repo, native = out / "repo", out / "native_repo"
    for d in (repo, native):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)

    onnx_path = out / "mlp.onnx"
    weights = make_mlp_onnx(onnx_path)
    onnx_bytes = onnx_path.read_bytes()
    rng = np.random.default_rng(1)
    x_ref = rng.standard_normal((4, MLP_IN)).astype(np.float32)
    np.savez(out / "mlp_reference.npz", x=x_ref, y=mlp_numpy(x_ref, weights).astype(np.float32))

    ig = instance_group(args.instances)

    write_model(
        repo,
        "simple",
        f"""
        name: "simple"
        backend: "python"
        max_batch_size: 8
        input [
          {{ name: "INPUT0", data_type: TYPE_INT32, dims: [ 16 ] }},
          {{ name: "INPUT1", data_type: TYPE_INT32, dims: [ 16 ] }}
        ]
        output [
          {{ name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 16 ] }},
          {{ name: "OUTPUT1", data_type: TYPE_INT32, dims: [ 16 ] }}
        ]
        {ig}""",
        {"model.py": SIMPLE_PY},
    )

    write_model(
        repo,
        "identity_fp32",
        f"""
        name: "identity_fp32"
        backend: "python"
        max_batch_size: 64
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
        dynamic_batching {{ }}
        {ig}""",
        {"model.py": IDENTITY_PY},
    )

    mlp_io = f"""
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ {MLP_IN} ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ {MLP_OUT} ] }} ]"""
    ort_params = f"""
        parameters {{ key: "intra_op_num_threads" value: {{ string_value: "{args.ort_threads}" }} }}
        parameters {{ key: "inter_op_num_threads" value: {{ string_value: "1" }} }}"""
    variants = {
        "mlp_onnx_py": "dynamic_batching { }",
        "mlp_onnx_py_nobatch": "",
        "mlp_onnx_py_delay500": "dynamic_batching { max_queue_delay_microseconds: 500 }",
    }
    for name, db in variants.items():
        write_model(
            repo,
            name,
            f"""
            name: "{name}"
            backend: "python"
            max_batch_size: 64{mlp_io}
            {db}{ort_params}
            {ig}""",
            {"model.py": ONNX_PY, "model.onnx": onnx_bytes},
        )

    # Same bytes for a server with a native onnxruntime backend (not loadable by the PyTriton
    # build of tritonserver, which ships only the python backend).
    write_model(
        native,
        "mlp_onnx",
        f"""
        name: "mlp_onnx"
        platform: "onnxruntime_onnx"
        max_batch_size: 64{mlp_io}
        dynamic_batching {{ }}
        parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{args.ort_threads}" }} }}
        parameters {{ key: "inter_op_thread_count" value: {{ string_value: "1" }} }}
        {ig}""",
        {"model.onnx": onnx_bytes},
    )

    if args.str:
        write_str_models(repo, native, args.ort_threads)

    print(f"repo:        {repo}")
    print(f"native_repo: {native}")
    print(f"onnx:        {onnx_path} ({len(onnx_bytes)} bytes)  ort intra_op threads={args.ort_threads}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""MLServer's side of benchmarks/vs_triton.py: the same identity and MLP as Triton's python models.

usage: python benchmarks/mlserver_models.py MLP_ONNX OUT_DIR

Writes OUT_DIR/{identity_fp32,mlp_onnx_py}/ with a `model-settings.json` and a custom runtime
(`{model}_runtime.py`, an `mlserver.MLModel`): identity returns INPUT0 as OUTPUT0 (FP32); the MLP runs
MLP_ONNX (benchmarks/triton_models.py writes it) with onnxruntime on one thread, as the Triton and
Shoal python models do. Both use MLServer's adaptive batching (`max_batch_size`, `max_batch_time`),
its counterpart of Triton's `dynamic_batching`: MLServer has no zero-delay batcher, so the wait is
the shortest that still lets a batch form (MAX_BATCH_TIME_S). Everything else is MLServer's default
(one inference worker process: `parallel_workers` 1).

MLServer answers no `GET /v2/models/{m}/config` (Triton's extension of the V2 protocol), which
perf_analyzer and `shoal perf` read for `max_batch_size`: each runtime adds that one route with
MLServer's `custom_handler`, answering only `max_batch_size`, so both clients can drive it. It does
not take part in inference.

Runs with the MLServer venv's python (benchmarks/setup_mlserver.sh) or any python: it only writes files.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

MAX_BATCH_SIZE = 64  # as Triton's identity_fp32 and mlp_onnx_py (benchmarks/triton_models.py)
MAX_BATCH_TIME_S = 0.0005

RUNTIME = '''
import os

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.handlers import custom_handler
from mlserver.types import InferenceRequest, InferenceResponse


class _Config(MLModel):
    @custom_handler(rest_path="/v2/models/{name}/config", rest_method="GET")
    async def config(self) -> dict:
        """Triton's model configuration extension, `max_batch_size` only: what perf clients read."""
        return {{"name": "{name}", "max_batch_size": {max_batch_size}}}


class Identity(_Config):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output(name="OUTPUT0", payload=x)]
        )


class Mlp(_Config):
    async def load(self) -> bool:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.onnx")
        self.sess = ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = np.ascontiguousarray(NumpyCodec.decode_input(payload.inputs[0]), dtype=np.float32)
        y = self.sess.run(None, {{"INPUT0": x}})[0]
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output(name="OUTPUT0", payload=y)]
        )
'''


def settings(name: str, implementation: str, width: int) -> dict:
    return {
        "name": name,
        "implementation": f"{name}_runtime.{implementation}",
        "max_batch_size": MAX_BATCH_SIZE,
        "max_batch_time": MAX_BATCH_TIME_S,
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, width]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, -1]}],
    }


def write(mlp_onnx: Path, out: Path) -> None:
    for name, implementation, width in (("identity_fp32", "Identity", -1), ("mlp_onnx_py", "Mlp", 256)):
        model = out / name
        model.mkdir(parents=True, exist_ok=True)
        # one module name per model: MLServer imports both into one worker process
        (model / f"{name}_runtime.py").write_text(RUNTIME.format(name=name, max_batch_size=MAX_BATCH_SIZE))
        (model / "model-settings.json").write_text(json.dumps(settings(name, implementation, width), indent=2))
        if implementation == "Mlp":
            shutil.copy2(mlp_onnx, model / "model.onnx")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    write(Path(sys.argv[1]), Path(sys.argv[2]))

"""The onnxruntime backend: one InferenceSession per model instance.

KIND_GPU instances use the TensorRT or CUDA execution provider when the installed
onnxruntime has them (the `gpu` extra); a GPU instance on a host without them fails
to load with that reason instead of silently running on the CPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort

from shared.errors import unavailable
from shared.model_config import ModelSpec


def _providers(kind: str, device: int) -> list:
    if kind != "KIND_GPU":
        return ["CPUExecutionProvider"]
    available = ort.get_available_providers()
    chosen: list = []
    if "TensorrtExecutionProvider" in available:
        chosen.append(("TensorrtExecutionProvider", {"device_id": device}))
    if "CUDAExecutionProvider" in available:
        chosen.append(("CUDAExecutionProvider", {"device_id": device}))
    if not chosen:
        raise unavailable(
            "instance group kind KIND_GPU needs onnxruntime with CUDA "
            f"(available providers: {', '.join(available)}); install `pip install 'shoal[gpu]'`"
        )
    return chosen + ["CPUExecutionProvider"]


class OnnxInstance:
    def __init__(self, spec: ModelSpec, path: Path, kind: str, device: int, threads: int) -> None:
        options = ort.SessionOptions()
        if threads > 0:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(str(path), sess_options=options, providers=_providers(kind, device))
        names = {i.name for i in self.session.get_inputs()}
        for tensor in spec.inputs:
            if tensor.name not in names:
                raise unavailable(
                    f"unexpected inference input '{tensor.name}', allowed inputs are: {', '.join(sorted(names))}"
                )
        self._string_inputs = {i.name for i in self.session.get_inputs() if i.type == "tensor(string)"}

    def run(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        feed = {
            name: (array.astype(str) if name in self._string_inputs and array.dtype == object else array)
            for name, array in inputs.items()
        }
        results = self.session.run(output_names, feed)
        return dict(zip(output_names, results))

    def close(self) -> None:
        del self.session


def create_instance(spec: ModelSpec, model_dir: Path, version: int, kind: str, device: int, threads: int) -> OnnxInstance:
    path = model_dir / str(version) / (spec.default_model_filename or "model.onnx")
    if not path.exists():
        raise unavailable(f"unable to find '{path}' for model '{spec.name}'")
    return OnnxInstance(spec, path, kind, device, threads)


def default_threads(instances: int) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, instances))

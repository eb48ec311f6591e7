"""The onnxruntime backend: one InferenceSession per model instance.

KIND_GPU instances use the TensorRT or CUDA execution provider when the installed
onnxruntime has them (the `gpu` extra); a GPU instance on a host without them fails
to load with that reason instead of silently running on the CPU.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import ml_dtypes
import numpy as np
import onnxruntime as ort

from shared.errors import unavailable
from shared.model_config import ModelSpec
from shared.paths import inside

_BF16 = np.dtype(ml_dtypes.bfloat16)
_ONNX_BFLOAT16 = 16


def _to_numpy(value: ort.OrtValue) -> np.ndarray:
    if value.element_type() != _ONNX_BFLOAT16:
        return value.numpy()
    shape = value.shape()
    count = int(np.prod(shape)) if shape else 1
    raw = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.ctypeslib.as_array(raw).copy().view(_BF16).reshape(shape)


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
        # onnxruntime's numpy binding has no bfloat16: such models go through OrtValues
        self._bf16 = any(t.type == "tensor(bfloat16)" for t in self.session.get_inputs() + self.session.get_outputs())

    def run(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        feed = {name: self._feed(name, array) for name, array in inputs.items()}
        if not self._bf16:
            return dict(zip(output_names, self.session.run(output_names, feed)))
        values = {
            name: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(np.uint16), _ONNX_BFLOAT16)
            if array.dtype == _BF16 else ort.OrtValue.ortvalue_from_numpy(array)
            for name, array in feed.items()
        }
        results = self.session.run_with_ort_values(output_names, values)
        return {name: _to_numpy(value) for name, value in zip(output_names, results)}

    def _feed(self, name: str, array: np.ndarray) -> np.ndarray:
        if name in self._string_inputs and array.dtype == object:
            # onnxruntime takes str elements; Triton's BYTES are raw bytes (UTF-8 text here)
            return np.array([x.decode("utf-8") if isinstance(x, bytes) else x for x in array.reshape(-1)],
                            dtype=object).reshape(array.shape)
        return array

    def close(self) -> None:
        del self.session


def create_instance(spec: ModelSpec, model_dir: Path, version: int, kind: str, device: int, threads: int) -> OnnxInstance:
    # the file may be a symlink within the repository, never a path out of it
    path = inside(model_dir.parent, f"{model_dir.name}/{version}/{spec.default_model_filename or 'model.onnx'}")
    if not path.exists():
        raise unavailable(f"unable to find '{path}' for model '{spec.name}'")
    return OnnxInstance(spec, path, kind, device, threads)


def default_threads(instances: int) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, instances))

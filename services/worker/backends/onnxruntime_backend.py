"""The onnxruntime backend: one InferenceSession per model instance.

Session options and execution providers come from the config as Triton's onnxruntime
backend reads them (`onnxruntime_options`). A KIND_GPU instance runs on its own device
(`device_id`) with the CUDA provider, and the TensorRT provider first when the config's
`gpu_execution_accelerator` asks for it. When the installed onnxruntime lacks a provider
the instance falls back (TensorRT -> CUDA -> CPU) and says so in one warning line naming
the model, the instance and the reason: the design's "CPU otherwise" choice, made visible.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import ml_dtypes
import numpy as np
import onnxruntime as ort

from services.worker.backends import Backend, Placement
from services.worker.backends.onnxruntime_options import CPU, SessionPlan, build_session_plan
from services.worker.backends.runner import BatchedRunner
from shared.config.model_config import ModelSpec
from shared.errors import invalid, unavailable

_BF16 = np.dtype(ml_dtypes.bfloat16)
log = logging.getLogger("shoal.worker")
_ONNX_BFLOAT16 = 16


def _to_numpy(value: ort.OrtValue) -> np.ndarray:
    if value.element_type() != _ONNX_BFLOAT16:
        return value.numpy()
    shape = value.shape()
    count = int(np.prod(shape)) if shape else 1
    raw = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.ctypeslib.as_array(raw).copy().view(_BF16).reshape(shape)


def session_options(plan: SessionPlan) -> ort.SessionOptions:
    options = ort.SessionOptions()
    for name, value in plan.options.items():
        if name == "execution_mode":
            value = getattr(ort.ExecutionMode, value)
        elif name == "graph_optimization_level":
            value = getattr(ort.GraphOptimizationLevel, value)
        setattr(options, name, value)
    for key, value in plan.config_entries.items():
        options.add_session_config_entry(key, value)
    return options


class OnnxInstance(BatchedRunner):
    def __init__(self, spec: ModelSpec, path: Path, placement: Placement) -> None:
        super().__init__(spec)
        kind, device, name = placement.kind, placement.device, placement.name
        try:
            plan = build_session_plan(spec.config, kind, device, placement.threads, ort.get_available_providers())
        except ValueError as exc:
            raise invalid(f"model '{spec.model_name}': {exc}") from None
        where = f"model '{spec.model_name}' instance '{name or spec.name}' ({kind}, device {device})"
        for reason in plan.fallbacks:
            log.warning("%s: %s", where, reason)
        self.session = ort.InferenceSession(
            str(path),
            sess_options=session_options(plan),
            providers=[p for p, _ in plan.providers],
            provider_options=[o for _, o in plan.providers],
        )
        # onnxruntime itself drops a provider it cannot start (e.g. TensorRT libraries missing)
        dropped = [p for p, _ in plan.providers if p not in self.session.get_providers()]
        if dropped:
            log.warning(
                "%s: onnxruntime could not start %s; running on %s",
                where,
                ", ".join(dropped),
                ", ".join(self.session.get_providers()),
            )
        self.providers = self.session.get_providers()
        if kind == "KIND_GPU" and self.providers != [CPU]:
            log.info("%s runs on %s", where, ", ".join(self.providers))
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
            if array.dtype == _BF16
            else ort.OrtValue.ortvalue_from_numpy(array)
            for name, array in feed.items()
        }
        results = self.session.run_with_ort_values(output_names, values)
        return {name: _to_numpy(value) for name, value in zip(output_names, results)}

    def _feed(self, name: str, array: np.ndarray) -> np.ndarray:
        if name in self._string_inputs and array.dtype == object:
            # onnxruntime takes str elements; Triton's BYTES are raw bytes (UTF-8 text here)
            return np.array(
                [x.decode("utf-8") if isinstance(x, bytes) else x for x in array.reshape(-1)], dtype=object
            ).reshape(array.shape)
        return array

    def close(self) -> None:
        del self.session


# One intra-op thread per session unless the config (`intra_op_thread_count`) or the worker's
# --intra-op-threads says otherwise: parallelism comes from instances and batching, and a
# repository of hundreds of models must not start a thread pool per session (issue 17).
BACKEND = Backend("model.onnx", OnnxInstance)

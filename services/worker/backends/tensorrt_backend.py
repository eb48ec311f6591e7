"""The TensorRT backend: serialized engines (`platform: "tensorrt_plan"`, `model.plan`).

Each instance deserializes the engine on its GPU, owns an execution context and a CUDA
stream, and runs a batch as: pick the optimization profile whose [min, max] holds the
request's shapes (`set_input_shape`), copy inputs to device buffers (CuPy), bind every
I/O address, `execute_async_v3`, copy outputs back, synchronize. TensorRT runs only on
GPUs: a KIND_CPU/KIND_MODEL instance (e.g. from a group the repository resolved on a
CPU view) runs on GPU 0 and says so.

`tensorrt` and `cupy` (the `gpu` extra) are imported when a model is loaded, never at
worker start: without them, or without a GPU, the model fails to load with a clear reason
and the rest of the repository loads. Not supported yet: shape tensors and outputs whose
shape depends on the data (they need an output allocator); both are refused at load.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from services.worker.backends import Backend, Placement
from services.worker.backends.runner import BatchedRunner
from shared.config.datatypes import numpy_dtype
from shared.config.model_config import ModelSpec
from shared.errors import Code, ShoalError, invalid, unavailable

log = logging.getLogger("shoal.worker")
NEEDS = "TensorRT backend needs an NVIDIA GPU and the 'tensorrt' package: pip install 'shoal[gpu]'"

Shape = tuple[int, ...]


def fits(shape: Sequence[int], low: Sequence[int], high: Sequence[int]) -> bool:
    return len(shape) == len(low) == len(high) and all(lo <= s <= hi for s, lo, hi in zip(shape, low, high))


def choose_profile(shapes: dict[str, Shape], profiles: list[dict[str, tuple[Shape, Shape]]]) -> int:
    """The first optimization profile whose [min, max] holds every input shape; a clear error otherwise."""
    for index, bounds in enumerate(profiles):
        if all(fits(shape, *bounds[name]) for name, shape in shapes.items() if name in bounds):
            return index
    # name the input that fits no profile (or, when each fits alone but not together, the first one)
    name, shape = next(
        ((n, s) for n, s in shapes.items() if not any(n in b and fits(s, *b[n]) for b in profiles)),
        next(iter(shapes.items())),
    )
    ranges = "; ".join(
        f"profile {i}: min {list(b[name][0])} max {list(b[name][1])}" for i, b in enumerate(profiles) if name in b
    )
    raise invalid(f"input '{name}' shape {list(shape)} is outside every optimization profile of the engine ({ranges})")


def _modules() -> tuple[Any, Any]:
    try:
        import cupy
        import tensorrt
    except ImportError as exc:
        raise unavailable(f"{NEEDS} ({exc})") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver / no device
        raise unavailable(f"{NEEDS} (no CUDA device: {exc})") from None
    if count < 1:
        raise unavailable(f"{NEEDS} (no CUDA device)")
    return tensorrt, cupy


def _numpy_dtype(trt: Any, dtype: Any) -> np.dtype:
    if dtype == trt.DataType.BF16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(trt.nptype(dtype))


def _bounds(engine: Any, name: str, profile: int) -> tuple[Shape, Shape]:
    """An input's [min, max] shapes in one optimization profile (TensorRT gives min, opt, max)."""
    low, _, high = engine.get_tensor_profile_shape(name, profile)
    return tuple(int(d) for d in low), tuple(int(d) for d in high)


def _device_view(array: np.ndarray) -> np.ndarray:
    """CuPy has no bfloat16: BF16 bytes travel as uint16 and are viewed back on the host."""
    return array.view(np.uint16) if array.dtype.name == "bfloat16" else array


class TensorRTInstance(BatchedRunner):
    def __init__(self, spec: ModelSpec, path: Path, placement: Placement) -> None:
        super().__init__(spec)
        kind, device, name = placement.kind, placement.device, placement.name
        trt, cp = _modules()
        self.trt, self.cp = trt, cp
        if kind != "KIND_GPU":
            log.info(
                "model '%s' instance '%s' is %s but TensorRT runs only on GPUs: it runs on GPU %d",
                spec.name,
                name or spec.name,
                kind,
                device,
            )
        self.device = cp.cuda.Device(device)
        with self.device:
            self.logger = trt.Logger(trt.Logger.WARNING)
            self.runtime = trt.Runtime(self.logger)
            self.engine = self.runtime.deserialize_cuda_engine(path.read_bytes())
            if self.engine is None:
                raise unavailable(
                    f"unable to deserialize the TensorRT engine {path} for model '{spec.model_name}' "
                    "(built for another TensorRT version or GPU?)"
                )
            self.context = self.engine.create_execution_context()
            self.stream = cp.cuda.Stream(non_blocking=True)
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.input_names = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if n not in self.input_names]
        self.dtypes = {n: _numpy_dtype(trt, self.engine.get_tensor_dtype(n)) for n in names}
        for n in names:
            if self.engine.is_shape_inference_io(n):
                raise unavailable(
                    f"model '{spec.model_name}': shape tensor '{n}' is not supported by Shoal's TensorRT backend yet"
                )
        self._check_config(names)
        self.profiles = [
            {n: _bounds(self.engine, n, p) for n in self.input_names}
            for p in range(self.engine.num_optimization_profiles)
        ]
        self.profile = 0

    def _check_config(self, names: list[str]) -> None:
        for tensor in list(self.spec.inputs) + list(self.spec.outputs):
            if tensor.name not in names:
                raise unavailable(
                    f"unexpected tensor '{tensor.name}' for model '{self.spec.model_name}': the engine has {', '.join(names)}"
                )
            engine_type = self.dtypes[tensor.name]
            if tensor.datatype == "BYTES":
                raise unavailable(
                    f"tensor '{tensor.name}' of model '{self.spec.model_name}' is BYTES: TensorRT has no string tensors"
                )
            if numpy_dtype(tensor.datatype) != engine_type:
                raise unavailable(
                    f"tensor '{tensor.name}' of model '{self.spec.model_name}' is {tensor.datatype} in the config "
                    f"but {engine_type} in the engine"
                )

    def run(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        cp, context = self.cp, self.context
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise invalid(f"the engine of model '{self.spec.model_name}' needs input(s) {', '.join(missing)}")
        shapes = {name: tuple(array.shape) for name, array in inputs.items()}
        with self.device, self.stream:
            profile = choose_profile(shapes, self.profiles) if self.profiles else 0
            if profile != self.profile:
                context.set_optimization_profile_async(profile, self.stream.ptr)
                self.profile = profile
            buffers = {}
            for name, array in inputs.items():
                if not context.set_input_shape(name, shapes[name]):
                    raise invalid(f"TensorRT refused shape {list(shapes[name])} for input '{name}'")
                host = _device_view(np.ascontiguousarray(array, dtype=self.dtypes[name]))
                device = cp.empty(host.shape, dtype=host.dtype)
                device.set(host, stream=self.stream)
                buffers[name] = device
            for name in self.output_names:  # every output needs an address, asked for or not
                shape = tuple(context.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise ShoalError(
                        f"output '{name}' has a data-dependent shape {list(shape)}: not supported yet", Code.UNSUPPORTED
                    )
                buffers[name] = cp.empty(shape, dtype=_device_view(np.empty(0, self.dtypes[name])).dtype)
            for name, buffer in buffers.items():
                context.set_tensor_address(name, buffer.data.ptr)
            if not context.execute_async_v3(self.stream.ptr):
                raise ShoalError(f"TensorRT failed to run model '{self.spec.model_name}'", Code.INTERNAL)
            outputs = {name: buffers[name].get(stream=self.stream).view(self.dtypes[name]) for name in output_names}
            self.stream.synchronize()
        return outputs

    def close(self) -> None:
        with self.device:
            self.stream.synchronize()
            del self.context, self.engine, self.runtime


# the GPU does the work: the instance's thread only launches it
BACKEND = Backend("model.plan", TensorRTInstance)

"""Triton's OpenVINO backend (`backend: "openvino"`): OpenVINO IR (`model.xml` + `model.bin`),
ONNX and the other formats OpenVINO reads, on the CPU.

As Triton's backend: the model file is `model.xml` unless `default_model_filename` names another
(`model.onnx`, ...); the config's inputs and outputs must be the model's (the backend's errors
otherwise) and their datatypes are set on the model's ports (OpenVINO converts); `parameters`
`INFERENCE_NUM_THREADS`, `COMPILATION_NUM_THREADS`, `NUM_STREAMS` (a number, AUTO or NUMA),
`PERFORMANCE_HINT` (LATENCY, THROUGHPUT, CUMULATIVE_THROUGHPUT), `HINT_BF16`, `CPU_EXTENSION_PATH`,
`TARGET_DEVICE` (CPU), `RESHAPE_IO_LAYERS`, `SKIP_OV_DYNAMIC_BATCHSIZE`, `ENABLE_BATCH_PADDING`,
checked with the backend's texts. Only KIND_CPU instances, as Triton's.

Where Shoal differs (docs/models.md, "OpenVINO"): a batching model keeps its batch dimension
dynamic, so dynamic batches of any size up to max_batch_size run as they are (Triton's backend
fixes the batch at max_batch_size and fails smaller batches unless `ENABLE_BATCH_PADDING`);
`SKIP_OV_DYNAMIC_BATCHSIZE: YES` fixes it as Triton does, and `ENABLE_BATCH_PADDING: YES` then pads.
Inference runs in FP32 unless `HINT_BF16: YES`: `INFERENCE_PRECISION_HINT: f32` goes to
`compile_model` with the other properties (OpenVINO picks BF16 by itself on CPUs that have it,
which moves outputs by ~1e-3; Triton's backend sets a precision only for `HINT_BF16`), and an
instance takes its share of the worker's cores unless `INFERENCE_NUM_THREADS` says otherwise.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from services.worker.backends import Backend, Placement
from services.worker.backends.parameters import yes
from services.worker.backends.runner import BatchedRunner, Tensors
from shared.config.model_config import ModelSpec, TensorSpec
from shared.errors import internal, invalid, unavailable

try:
    import openvino as ov
except ImportError:  # the openvino extra: a model load says what to install
    ov = None

log = logging.getLogger("shoal.worker")
EXTRA = "pip install 'shoal[openvino]'"
ELEMENTS = {
    "BOOL": "boolean",
    "UINT8": "u8",
    "UINT16": "u16",
    "UINT32": "u32",
    "UINT64": "u64",
    "INT8": "i8",
    "INT16": "i16",
    "INT32": "i32",
    "INT64": "i64",
    "FP16": "f16",
    "FP32": "f32",
}


def device_properties(spec: ModelSpec, threads: int) -> dict[str, str]:
    """The device properties of the config's parameters, with the backend's checks and texts."""
    properties: dict[str, str] = {"INFERENCE_PRECISION_HINT": "f32"}
    if threads > 0:
        properties["INFERENCE_NUM_THREADS"] = str(threads)
    for key in ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS"):
        value = spec.parameters.get(key, "").strip().lower()
        if value:
            if not value.isdigit():
                raise invalid(f"expected the parameter '{key}' to be a non-negative number, got {value}")
            properties[key] = value
    bf16 = spec.parameters.get("HINT_BF16", "").strip().lower()
    if bf16:
        if bf16 != "yes":
            raise invalid(f"expected the parameter 'HINT_BF16' to be YES, got {bf16}")
        properties["INFERENCE_PRECISION_HINT"] = "bf16"
    streams = spec.parameters.get("NUM_STREAMS", "").strip().lower()
    if streams:
        if streams not in ("auto", "numa") and not streams.isdigit():
            raise invalid(f"expected the parameter 'NUM_STREAMS' to be either AUTO/NUMA/<int_value>, got {streams}")
        properties["NUM_STREAMS"] = streams.upper() if not streams.isdigit() else streams
    hint = spec.parameters.get("PERFORMANCE_HINT", "").strip().lower()
    if hint:
        if hint not in ("latency", "throughput", "cumulative_throughput"):
            raise invalid(
                f"expected the parameter 'PERFORMANCE_HINT' to be LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT, got {hint}"
            )
        properties["PERFORMANCE_HINT"] = hint.upper()
    return properties


def precision(compiled: Any) -> str:
    """The precision a compiled model runs in, as the hint's values are spelled (f32, bf16, ...)."""
    return str(compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name())


def _shape_text(shape: Any) -> str:
    return str(shape)


def _ports(ports: list[Any]) -> dict[str, Any]:
    return {name: port for port in ports for name in port.get_names()}


class OpenVinoInstance(BatchedRunner):
    def __init__(self, spec: ModelSpec, path: Path, placement: Placement) -> None:
        super().__init__(spec)
        if ov is None:
            raise unavailable(f"the OpenVINO backend needs the openvino package: {EXTRA}")
        if placement.kind != "KIND_CPU":
            raise invalid(
                f"unable to load model '{spec.model_name}', Triton OpenVINO backend supports only Kind CPU and AUTO"
            )
        core = ov.Core()
        extension = spec.parameters.get("CPU_EXTENSION_PATH", "")
        if extension:
            core.add_extension(extension)
        self.device = spec.parameters.get("TARGET_DEVICE", "CPU").strip().upper() or "CPU"
        threads = 0 if "INFERENCE_NUM_THREADS" in spec.parameters else placement.threads
        properties = device_properties(spec, threads)
        try:
            model = core.read_model(str(path))
        except RuntimeError as exc:
            raise internal(f"openvino error in reading model: {str(exc).strip().splitlines()[0]}") from None
        self.static_batch = spec.max_batch_size > 0 and yes(spec, "SKIP_OV_DYNAMIC_BATCHSIZE")
        self.padding = yes(spec, "ENABLE_BATCH_PADDING")
        model = self._configure(core, model, spec)
        try:
            self.compiled = core.compile_model(model, self.device, properties)
        except RuntimeError as exc:
            raise internal(f"openvino error in loading model: {str(exc).strip().splitlines()[0]}") from None
        # what OpenVINO compiled with: HINT_BF16 on a CPU without BF16 stays f32 (OpenVINO's choice)
        self.precision = precision(self.compiled)
        if self.precision != properties["INFERENCE_PRECISION_HINT"]:
            log.info(
                "model '%s': OpenVINO runs it in %s (%s asked)",
                spec.name,
                self.precision,
                properties["INFERENCE_PRECISION_HINT"],
            )
        self.request = self.compiled.create_infer_request()
        self.outputs = _ports(list(self.compiled.outputs))

    def _configure(self, core: Any, model: Any, spec: ModelSpec) -> Any:
        """Check the config against the model, set the config's datatypes (and shapes) on its ports."""
        inputs, outputs = _ports(list(model.inputs)), _ports(list(model.outputs))
        if len(model.inputs) != len(spec.inputs):
            raise invalid(
                f"unable to load model '{spec.model_name}', configuration expects {len(spec.inputs)} inputs, "
                f"model provides {len(model.inputs)}"
            )
        for tensors, ports, what in ((spec.inputs, inputs, "input"), (spec.outputs, outputs, "output")):
            for tensor in tensors:
                if tensor.name not in ports:
                    allowed = ", ".join(sorted(ports))
                    raise invalid(f"unexpected inference {what} '{tensor.name}', allowed {what}s are: {allowed}")
                if tensor.datatype not in ELEMENTS:
                    raise internal(
                        f"unsupported datatype TYPE_{tensor.datatype} for {what} '{tensor.name}' for model '{spec.model_name}'"
                    )
        batching = spec.max_batch_size > 0
        shapes = {}
        for tensor in spec.inputs:
            shape = ov.PartialShape(inputs[tensor.name].get_partial_shape())
            self._check_rank(spec, tensor, shape, batching)
            if yes(spec, "RESHAPE_IO_LAYERS"):
                for index, dim in enumerate(tensor.reshape or tensor.dims, start=1 if batching else 0):
                    shape[index] = ov.Dimension(dim) if dim > 0 else ov.Dimension()
            if batching:
                shape[0] = ov.Dimension(spec.max_batch_size) if self.static_batch else ov.Dimension()
            shapes[tensor.name] = shape
        model.reshape({inputs[name]: shape for name, shape in shapes.items()})
        processor = ov.preprocess.PrePostProcessor(model)
        for tensor in spec.inputs:
            processor.input(tensor.name).tensor().set_element_type(getattr(ov.Type, ELEMENTS[tensor.datatype]))
        for tensor in spec.outputs:
            processor.output(tensor.name).tensor().set_element_type(getattr(ov.Type, ELEMENTS[tensor.datatype]))
        return processor.build()

    @staticmethod
    def _check_rank(spec: ModelSpec, tensor: TensorSpec, shape: Any, batching: bool) -> None:
        dims = tensor.reshape or tensor.dims
        expected = len(dims) + (1 if batching else 0)
        if shape.rank.is_static and shape.rank.get_length() != expected:
            full = f"[{', '.join(str(d) for d in ([-1] if batching else []) + list(dims))}]"
            raise invalid(
                f"model '{spec.model_name}', tensor '{tensor.name}': the model expects {shape.rank.get_length()} "
                f"dimensions (shape {_shape_text(shape)}) but the model configuration specifies {expected} "
                f"dimensions (shape {full})"
            )

    def run(self, inputs: Tensors, output_names: list[str]) -> Tensors:
        rows = len(next(iter(inputs.values()))) if self.spec.max_batch_size > 0 and inputs else 0
        if self.static_batch and rows != self.spec.max_batch_size:
            if not self.padding:
                raise internal(
                    f"expected requests with batch size '{self.spec.max_batch_size}', got '{rows}'... this error "
                    "can be avoided by setting 'ENABLE_BATCH_PADDING' parameter in model configuration to 'YES' "
                    "at a performance cost."
                )
            pad = self.spec.max_batch_size - rows
            inputs = {n: np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)]) for n, a in inputs.items()}
        results = self.request.infer(inputs)
        answer = {name: np.asarray(results[self.outputs[name]]) for name in output_names}  # copies already
        if self.static_batch and rows != self.spec.max_batch_size:
            answer = {name: array[:rows] for name, array in answer.items()}
        return answer

    def close(self) -> None:
        del self.request, self.compiled


# instances share the worker's cores (INFERENCE_NUM_THREADS each), like onnxruntime's threads would
BACKEND = Backend("model.xml", OpenVinoInstance, shares_cores=True)

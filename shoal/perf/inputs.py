"""The tensors a run sends: shapes from the model's metadata and `--shape`, data zero, random or from a file.

Each request carries one "step" of data; like perf_analyzer, a file with several entries is sent in
turn and the same bytes are reused across requests (encoding is paid once, not per request).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tritonclient.utils import serialize_byte_tensor, triton_to_np_dtype

from shoal.perf.options import PerfError


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: list[int]  # as in the model's metadata: -1 for variable dims (and the batch dim)


@dataclass
class ModelInfo:
    name: str
    version: str
    max_batch_size: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    shape: list[int]
    data: bytes  # raw tensor bytes; BYTES elements length-prefixed as on the wire


@dataclass(frozen=True)
class ShmRef:
    region: str
    offset: int
    byte_size: int


@dataclass
class Step:
    inputs: list[Tensor]
    input_shm: dict[str, ShmRef] = field(default_factory=dict)
    output_shm: dict[str, ShmRef] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)


def sample_shape(spec: TensorSpec, info: ModelInfo, shapes: dict[str, list[int]]) -> list[int]:
    """The shape of one sample (no batch dim): `--shape` where given, else the metadata's fixed dims."""
    dims = spec.shape[1:] if info.max_batch_size > 0 else spec.shape
    if spec.name in shapes:
        given = shapes[spec.name]
        if len(given) != len(dims) or any(d != -1 and d != g for d, g in zip(dims, given)):
            raise PerfError(f"--shape {spec.name}:{','.join(map(str, given))} does not fit the model's {dims}")
        return list(given)
    if any(d < 0 for d in dims):
        raise PerfError(
            f"input '{spec.name}' has variable dims {dims}: give its shape with --shape {spec.name}:d1,d2,..."
        )
    return list(dims)


def _array(spec: TensorSpec, shape: list[int], kind: str, rng: np.random.Generator) -> np.ndarray:
    if spec.datatype == "BYTES":
        size = int(np.prod(shape))
        words = [b"0" * 16] * size if kind == "zero" else [rng.bytes(8).hex().encode() for _ in range(size)]
        return np.array(words, dtype=np.object_).reshape(shape)
    dtype = triton_to_np_dtype(spec.datatype)
    if dtype is None:
        raise PerfError(f"input '{spec.name}': datatype {spec.datatype} is not supported")
    if kind == "zero":
        return np.zeros(shape, dtype=dtype)
    if np.issubdtype(dtype, np.floating):
        return rng.random(shape, dtype=np.float32).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    return rng.integers(0, 100, shape).astype(dtype)


def _from_json(spec: TensorSpec, value: object, shape: list[int]) -> np.ndarray:
    if isinstance(value, dict):
        shape = list(value.get("shape", shape))
        if "b64" in value:
            raw = base64.b64decode(value["b64"])
            return np.frombuffer(raw, dtype=triton_to_np_dtype(spec.datatype)).reshape(shape)
        value = value.get("content")
    if not isinstance(value, list):
        raise PerfError(f"input data for '{spec.name}' must be a list or {{'content': [...], 'shape': [...]}}")
    dtype = np.object_ if spec.datatype == "BYTES" else triton_to_np_dtype(spec.datatype)
    flat = np.array([str(v).encode() for v in value] if spec.datatype == "BYTES" else value, dtype=dtype)
    if flat.size != int(np.prod(shape)):
        raise PerfError(f"input data for '{spec.name}' has {flat.size} elements, shape {shape} needs {np.prod(shape)}")
    return flat.reshape(shape)


def _tensor(spec: TensorSpec, sample: np.ndarray, info: ModelInfo, batch_size: int) -> Tensor:
    array = np.stack([sample] * batch_size) if info.max_batch_size > 0 else sample
    # serialize_byte_tensor answers a 0-d object array holding the length-prefixed bytes
    data = serialize_byte_tensor(array).item() if spec.datatype == "BYTES" else array.tobytes()
    return Tensor(spec.name, spec.datatype, list(array.shape), data)


def build_steps(info: ModelInfo, shapes: dict[str, list[int]], input_data: str, batch_size: int) -> list[Step]:
    if info.max_batch_size == 0 and batch_size != 1:
        raise PerfError(f"model '{info.name}' does not support batching: -b must be 1")
    if batch_size > max(info.max_batch_size, 1):
        raise PerfError(f"-b {batch_size} is above the model's max_batch_size {info.max_batch_size}")
    outputs = [o.name for o in info.outputs]
    if input_data in ("zero", "random"):
        rng = np.random.default_rng(0)
        samples = {s.name: _array(s, sample_shape(s, info, shapes), input_data, rng) for s in info.inputs}
        return [Step([_tensor(s, samples[s.name], info, batch_size) for s in info.inputs], outputs=outputs)]
    try:
        entries = json.loads(Path(input_data).read_text())["data"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PerfError(f"--input-data {input_data}: expected zero, random or a JSON file with 'data': {exc}") from None
    steps = []
    for entry in entries:
        missing = [s.name for s in info.inputs if s.name not in entry]
        if missing:
            raise PerfError(f"--input-data {input_data}: an entry lacks input(s) {missing}")
        tensors = []
        for spec in info.inputs:
            default = shapes.get(spec.name) or [abs(d) for d in (spec.shape[1:] if info.max_batch_size else spec.shape)]
            tensors.append(_tensor(spec, _from_json(spec, entry[spec.name], default), info, batch_size))
        steps.append(Step(tensors, outputs=outputs))
    if not steps:
        raise PerfError(f"--input-data {input_data}: 'data' is empty")
    return steps

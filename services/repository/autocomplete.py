"""Backend auto-complete for models without (complete) inputs/outputs (docs/triton-spec.md §2.4):
ONNX graphs, python models' own `auto_complete_config`, python-based backends' (the backend's
model.py), as each Triton backend completes its configs."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.repository.dali_autocomplete import autofill, read_pipeline, unbatched
from shared.config import triton_protos
from shared.config.backend_config import BackendConfig, default_max_batch_size, python_based_runtime
from shared.config.paths import inside
from shared.errors import invalid

if TYPE_CHECKING:
    import onnx

pb: Any = triton_protos.load("model_config_pb2")


@dataclass(frozen=True)
class AutoComplete:
    """Whether configs are completed from the model files, and what the backends were given."""

    enabled: bool = True
    backend_directory: str = ""
    backend_config: BackendConfig = field(default_factory=dict)
    config_name: str = ""  # --model-config-name: <model>/configs/<name>.pbtxt first


def config_path(model_dir: Path, config_name: str = "") -> Path:
    """The config file a model is read from: with `--model-config-name`, `configs/<name>.pbtxt` where
    it exists, else `config.pbtxt` (core's GetModelConfigFullPath)."""
    if config_name:
        custom = model_dir / "configs" / f"{config_name}.pbtxt"
        if custom.exists():
            return custom
    return model_dir / "config.pbtxt"


def complete(config: pb.ModelConfig, model_dir: Path, version: int, how: AutoComplete) -> pb.ModelConfig:
    """`config` completed by its backend from the newest version's files, as Triton's backends do."""
    backend = config.backend

    def version_file(default: str) -> Path:
        return inside(model_dir.parent, f"{model_dir.name}/{version}/{config.default_model_filename or default}")

    if backend == "onnxruntime":
        onnx_file = version_file("model.onnx")
        if onnx_file.is_file():
            autocomplete_onnx(config, onnx_file, default_max_batch_size(how.backend_config, backend))
    elif backend == "openvino":
        model_file = version_file("model.xml")
        if model_file.is_file():
            autocomplete_openvino(config, model_file, default_max_batch_size(how.backend_config, backend))
    elif backend == "dali":
        complete_dali(config, model_dir, version, how.config_name)
    elif backend == "python":
        model_file = version_file("model.py")
        if model_file.is_file():
            config = autocomplete_python(config, model_file)
    else:
        runtime = python_based_runtime(how.backend_directory, backend)
        if runtime is not None:  # a python-based backend completes every config naming it (vLLM's does)
            config = autocomplete_python(config, runtime)
    return config


def complete_dali(config: pb.ModelConfig, model_dir: Path, version: int, config_name: str) -> None:
    """Triton's DALI auto-complete, from what the version's pipeline declares (dali_autocomplete.py)."""
    config_file = config_path(model_dir, config_name)
    text = config_file.read_text(errors="replace") if config_file.is_file() else ""
    split = (
        config.parameters["split_along_outer_axis"].string_value
        if "split_along_outer_axis" in config.parameters
        else ""
    )
    pipeline = read_pipeline(model_dir, version, config.default_model_filename or "model.dali")
    if pipeline is not None:  # None: no DALI on this host (the worker's load says what to install)
        autofill(config, pipeline, batched=not unbatched(text), split=set(filter(None, split.split(":"))))


# ONNX's element types (onnx.TensorProto's names) -> the config's: by name, so that onnx (0.3-0.5 s of
# CPU to import) is imported only when an ONNX model is auto-completed, not at every repository start
_ONNX_TO_CONFIG: dict[str, int] = {
    "BOOL": pb.TYPE_BOOL,
    "UINT8": pb.TYPE_UINT8,
    "UINT16": pb.TYPE_UINT16,
    "UINT32": pb.TYPE_UINT32,
    "UINT64": pb.TYPE_UINT64,
    "INT8": pb.TYPE_INT8,
    "INT16": pb.TYPE_INT16,
    "INT32": pb.TYPE_INT32,
    "INT64": pb.TYPE_INT64,
    "FLOAT16": pb.TYPE_FP16,
    "FLOAT": pb.TYPE_FP32,
    "DOUBLE": pb.TYPE_FP64,
    "STRING": pb.TYPE_STRING,
    "BFLOAT16": pb.TYPE_BF16,
}


@functools.cache
def _onnx_element_types() -> dict[int, int]:
    import onnx

    return {getattr(onnx.TensorProto, name): data_type for name, data_type in _ONNX_TO_CONFIG.items()}


def _shape(value: onnx.ValueInfoProto) -> list[int]:
    dims = value.type.tensor_type.shape.dim
    return [d.dim_value if d.HasField("dim_value") else -1 for d in dims]


def autocomplete_onnx(config: pb.ModelConfig, model_file: Path, default_max_batch_size: int = 4) -> None:
    """Fill missing inputs/outputs and max_batch_size from the ONNX graph, as Triton's backend does."""
    if config.input and config.output:
        return
    import onnx

    model = onnx.load(str(model_file), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    outputs = list(model.graph.output)
    can_batch = all(_shape(v)[:1] == [-1] for v in inputs + outputs)
    if can_batch and config.max_batch_size == 0:
        config.max_batch_size = default_max_batch_size
        if not config.HasField("dynamic_batching") and not config.HasField("sequence_batching"):
            if config.max_batch_size > 1:
                config.dynamic_batching.SetInParent()
    elif not can_batch and config.max_batch_size != 0:
        raise invalid(
            f"autofill failed for model '{config.name}': model does not support batching "
            "while non-zero max_batch_size is specified"
        )
    batching = config.max_batch_size > 0
    for values, target in ((inputs, config.input), (outputs, config.output)):
        if target:
            continue
        for value in values:
            elem = value.type.tensor_type.elem_type
            if elem not in _onnx_element_types():
                raise invalid(f"unsupported ONNX element type {elem} for '{value.name}'")
            dims = _shape(value)[1:] if batching else _shape(value)
            io = target.add(name=value.name, data_type=_onnx_element_types()[elem])
            if dims:
                io.dims.extend(dims)
            else:
                io.dims.append(1)
                if batching:
                    io.reshape.SetInParent()


_OPENVINO_TO_CONFIG = {
    "boolean": pb.TYPE_BOOL,
    "u8": pb.TYPE_UINT8,
    "u16": pb.TYPE_UINT16,
    "u32": pb.TYPE_UINT32,
    "u64": pb.TYPE_UINT64,
    "i8": pb.TYPE_INT8,
    "i16": pb.TYPE_INT16,
    "i32": pb.TYPE_INT32,
    "i64": pb.TYPE_INT64,
    "f16": pb.TYPE_FP16,
    "f32": pb.TYPE_FP32,
}


def autocomplete_openvino(config: pb.ModelConfig, model_file: Path, default_max_batch_size: int = 4) -> None:
    """Triton's OpenVINO auto-complete: max_batch_size (and dynamic batching) when every input and
    output's layout has a batch dimension, then the missing inputs and outputs (name, datatype,
    dims: -1 where the model's shape is dynamic), from the model OpenVINO reads."""
    if config.input and config.output:
        return
    try:
        import openvino as ov
    except ImportError:
        return  # the worker's load says what to install
    try:
        model = ov.Core().read_model(str(model_file))
    except RuntimeError as exc:
        raise invalid(
            f"openvino error in reading model for auto-complete: {str(exc).strip().splitlines()[0]}"
        ) from None
    ports = list(model.inputs) + list(model.outputs)
    batched = all(ov.layout_helpers.get_layout(p).has_name("N") for p in ports)
    if batched and config.max_batch_size == 0:
        config.max_batch_size = max(default_max_batch_size, 1)
        if (
            config.max_batch_size > 1
            and not config.HasField("dynamic_batching")
            and not config.HasField("sequence_batching")
        ):
            config.dynamic_batching.SetInParent()
    skip = 1 if config.max_batch_size > 0 else 0
    for ports_of, target in ((model.inputs, config.input), (model.outputs, config.output)):
        if target:
            continue
        for port in ports_of:
            element = port.get_element_type().get_type_name()
            if element not in _OPENVINO_TO_CONFIG:
                raise invalid(f"unsupported OpenVINO element type {element} for '{port.get_any_name()}'")
            shape = port.get_partial_shape()
            dims = [d.get_length() if d.is_static else -1 for d in shape][skip:]
            target.add(name=port.get_any_name(), data_type=_OPENVINO_TO_CONFIG[element], dims=dims or [1])


PYTHON_AUTOCOMPLETE_TIMEOUT_S = 60.0


def autocomplete_python(config: pb.ModelConfig, model_file: Path) -> pb.ModelConfig:
    """The model's own `auto_complete_config(config)`, run in a separate process (it runs the
    model's module); models that do not define it are not imported at all."""
    if "auto_complete_config" not in model_file.read_text(errors="replace"):
        return config
    from shared.config.model_config import from_json, to_json

    try:
        done = subprocess.run(
            [sys.executable, "-m", "services.worker.python.hosting.autocomplete_runner", str(model_file)],
            input=json.dumps(to_json(config)),
            capture_output=True,
            text=True,
            timeout=PYTHON_AUTOCOMPLETE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise invalid(
            f"auto_complete_config of model '{config.name}' did not return within {PYTHON_AUTOCOMPLETE_TIMEOUT_S:.0f} s"
        ) from None
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or ["the process exited with status %d" % done.returncode])[-1]
        raise invalid(f"auto_complete_config of model '{config.name}' failed: {detail}")
    try:
        return from_json(json.loads(done.stdout))
    except Exception as exc:  # not JSON, or not a ModelConfig
        raise invalid(f"auto_complete_config of model '{config.name}' returned an unusable config: {exc}") from None

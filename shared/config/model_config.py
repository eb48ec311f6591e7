"""`config.pbtxt` -> Triton's `ModelConfig` -> normalized JSON -> Shoal's own `ModelSpec`.

Parsing uses protobuf `text_format` with the `ModelConfig` message shipped in
`tritonclient`, so accepted syntax and error texts match Triton's. The repository
service normalizes and publishes Triton's JSON form (what `GET .../config`
returns); every other service converts that JSON once into a frozen `ModelSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.config.datatypes import config_to_protocol
from shared.config.metric_config import validate_model_metrics
from shared.errors import ShoalError, invalid

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2 as pb
else:

    class _Proto:
        """tritonclient's `model_config_pb2`, imported on first use (without tritonclient's gRPC
        client: shared/config/triton_protos.py): protobuf, which a process that only reads the
        published JSON configs (a python model's instance process) never needs."""

        def __getattr__(self, name: str) -> Any:
            from shared.config import triton_protos

            return getattr(triton_protos.load("model_config_pb2"), name)

    pb = _Proto()


def __getattr__(name: str) -> Any:
    if name == "ModelConfig":  # the message class, as `model_config.ModelConfig`
        return pb.ModelConfig
    raise AttributeError(name)


# int64/uint64 fields protobuf JSON prints as strings; Triton turns them back into numbers.
_INT64_KEYS = frozenset(
    {
        "dims",
        "shape",
        "versions",
        "max_queue_delay_microseconds",
        "priority_levels",
        "default_priority_level",
        "default_timeout_microseconds",
        "max_sequence_idle_microseconds",
        "model_version",
    }
)

# Triton core's server-side autofill (src/model_config_utils.cc `AutoCompleteBackendFields`), in
# its order: a rule fires on the config's platform or default_model_filename, else (neither given)
# on its file in the first version directory; rule -> (backend, platform, default file).
# `kind`: the file must be a "file", a "dir", or "any" of the two.
_AutofillRule = tuple[str, str, str, str, tuple[str, ...]]
_AUTOFILL: tuple[_AutofillRule, ...] = (
    # file, kind, backend, platform, platforms naming it
    ("model.savedmodel", "dir", "tensorflow", "tensorflow_savedmodel", ("tensorflow_savedmodel",)),
    ("model.graphdef", "file", "tensorflow", "tensorflow_graphdef", ("tensorflow_graphdef",)),
    ("model.plan", "file", "tensorrt", "tensorrt_plan", ("tensorrt_plan",)),
    ("model.onnx", "any", "onnxruntime", "onnxruntime_onnx", ("onnxruntime_onnx",)),
    ("model.xml", "any", "openvino", "", ()),
    ("model.pt", "file", "pytorch", "pytorch_libtorch", ("pytorch_libtorch", "libtorch")),
    ("model.pt2", "file", "pytorch", "torch_aoti", ("torch_aoti",)),
    ("model.py", "any", "python", "", ()),
    # not core's: DALI's serialized pipeline, which core leaves to the `model.<backend>` name rule
    ("model.dali", "any", "dali", "", ()),
)
# a backend given without a platform or file: core's defaults
_BACKEND_DEFAULTS = {
    "tensorflow": ("", ""),  # core needs the platform for TensorFlow
    "tensorrt": ("tensorrt_plan", "model.plan"),
    "onnxruntime": ("onnxruntime_onnx", "model.onnx"),
    "openvino": ("", "model.xml"),
    "pytorch": ("pytorch_libtorch", "model.pt"),
    "python": ("", "model.py"),
    "dali": ("", "model.dali"),
}


def parse_text(text: str, path: str | Path = "config.pbtxt") -> pb.ModelConfig:
    """Parse text-format config; errors name the file, line and column."""
    from google.protobuf import text_format  # protobuf, on first use (see `_Proto`)

    try:
        return text_format.Parse(text, pb.ModelConfig())
    except (text_format.ParseError, ValueError) as exc:  # upb raises ValueError for an enum number out of range
        raise invalid(f"failed to read text proto from {path}: {exc}") from None


def read_text(path: Path) -> str:
    """A config file's text. One that is not UTF-8 is refused, as Triton's parser refuses invalid
    UTF-8 in a string field (before: an unhandled UnicodeDecodeError was the model's reason)."""
    raw = path.read_bytes()
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise invalid(f"failed to read text proto from {path}: {line}: invalid UTF-8 data") from None


def parse_json(text: str) -> pb.ModelConfig:
    """A `config` override as Triton's load API takes it (protobuf JSON, proto field names)."""
    from google.protobuf import json_format

    try:
        return json_format.Parse(text, pb.ModelConfig())
    except json_format.ParseError as exc:
        raise invalid(f"Invalid config override: {exc}") from None


def to_json(config: pb.ModelConfig) -> dict[str, Any]:
    """Triton's JSON for `GET /v2/models/{m}/config` (int64 fields as numbers)."""
    from google.protobuf import json_format

    raw = json_format.MessageToDict(config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    ints: dict[str, Any] = _ints(raw)
    return ints


def from_json(data: dict[str, Any]) -> pb.ModelConfig:
    from google.protobuf import json_format

    return json_format.ParseDict(data, pb.ModelConfig())


def _ints(node: Any, key: str = "") -> Any:
    if isinstance(node, dict):
        return {k: _ints(v, k) for k, v in node.items()}
    if isinstance(node, list):
        return [_ints(v, key) for v in node]
    if key in _INT64_KEYS and isinstance(node, str):
        return int(node)
    return node


def autofill_backend(config: pb.ModelConfig, model_dir: Path, versions: list[int]) -> None:
    """Triton's server-side autofill of name, backend, platform and default file (core's
    `AutoCompleteBackendFields`, see `_AUTOFILL`)."""
    if not config.name:
        config.name = model_dir.name
    if config.platform == "ensemble":
        return
    if not config.backend:
        config.backend = _detected_backend(config, model_dir, versions)
    if not config.backend:
        if config.platform or config.default_model_filename:
            return  # core leaves it so; the model's load fails on its empty backend
        raise invalid(
            f"Invalid model name: Could not determine backend for model '{config.name}' "
            "with no backend in model configuration. Expected model name of the form "
            "'model.<backend_name>'."
        )
    platform, filename = _BACKEND_DEFAULTS.get(config.backend, ("", ""))
    if config.backend == "pytorch" and config.platform:  # core's default file only with its default platform
        filename = "model.pt2" if config.platform == "torch_aoti" else ""
    if config.backend == "tensorflow":
        filename = {"tensorflow_savedmodel": "model.savedmodel", "tensorflow_graphdef": "model.graphdef"}.get(
            config.platform, ""
        )
    if not config.platform and platform:
        config.platform = platform
    if not config.default_model_filename and filename:
        config.default_model_filename = filename


def _detected_backend(config: pb.ModelConfig, model_dir: Path, versions: list[int]) -> str:
    """The backend core's rules give a config without one: by platform or default file, else by the
    first version directory's files (core's first: the least name, as a string), else by the
    model's name, `<anything>.<backend>` (core's rule for custom backends)."""
    for filename, _, backend, platform, platforms in _AUTOFILL:
        if config.platform in platforms or (config.default_model_filename == filename and filename):
            if platform and not config.platform:
                config.platform = platform
            return backend
    if config.platform or config.default_model_filename:
        return ""
    if versions:
        version_dir = model_dir / min(str(v) for v in versions)
        for filename, kind, backend, platform, _ in _AUTOFILL:
            path = version_dir / filename
            if path.exists() and kind != ("file" if path.is_dir() else "dir"):
                config.platform = platform
                return backend
    _, dot, backend = str(config.name).partition(".")
    if dot and backend:
        config.default_model_filename = f"model.{backend}"
    return backend


def normalize(config: pb.ModelConfig, default_count: int = 2) -> None:
    """Triton's `NormalizeModelConfig` + `NormalizeInstanceGroup` on a CPU-only host."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if config.HasField("dynamic_batching") and not config.dynamic_batching.preferred_batch_size:
        if config.max_batch_size > 0:
            config.dynamic_batching.preferred_batch_size.append(config.max_batch_size)
    if config.HasField("sequence_batching"):
        seq = config.sequence_batching
        if seq.max_sequence_idle_microseconds == 0:
            seq.max_sequence_idle_microseconds = 1_000_000
        if seq.HasField("oldest") and not seq.oldest.preferred_batch_size:
            if config.max_batch_size > 0:
                seq.oldest.preferred_batch_size.append(config.max_batch_size)
    if config.platform == "ensemble":
        return
    config.optimization.input_pinned_memory.enable = True
    config.optimization.output_pinned_memory.enable = True
    if not config.instance_group:
        config.instance_group.add(name=config.name)  # Triton names only the group it creates after the model
    for index, group in enumerate(config.instance_group):
        if not group.name:  # a group the config lists without a name: `<model>_<index>`, even a lone one
            group.name = f"{config.name}_{index}"
        if group.kind == pb.ModelInstanceGroup.KIND_AUTO:
            group.kind = pb.ModelInstanceGroup.KIND_GPU if group.gpus else pb.ModelInstanceGroup.KIND_CPU
        if group.count < 1:
            cpu_default = group.kind == pb.ModelInstanceGroup.KIND_CPU and config.backend in (
                "onnxruntime",
                "tensorflow",
            )
            group.count = default_count if cpu_default else 1


def validate(config: pb.ModelConfig) -> None:
    """The load-time checks of Triton's `ValidateModelConfig` that Shoal enforces (§2.6)."""
    name = config.name
    if config.max_batch_size < 0:
        raise invalid(f"'max_batch_size' must be non-negative value for {name}")
    seen: set[str] = set()
    for io in list(config.input) + list(config.output):
        if not io.name:
            raise invalid(f"model input or output must specify 'name' for {name}")
        if io.data_type == pb.TYPE_INVALID:
            raise invalid(f"model input '{io.name}' must specify 'data_type' for {name}")
        if not io.dims and not io.HasField("reshape"):
            raise invalid(f"model input '{io.name}' must specify 'dims' for {name}")
        if any(d < -1 or d == 0 for d in io.dims):
            raise invalid(f"dimension for '{io.name}' of model '{name}' must be > 0 or -1")
        seen.add(io.name)
    if config.HasField("dynamic_batching"):
        db = config.dynamic_batching
        for size in db.preferred_batch_size:
            if size < 1 or size > config.max_batch_size:
                raise invalid(
                    f"dynamic batching preferred size must be positive and <= "
                    f"max_batch_size {config.max_batch_size} for {name}"
                )
        if db.priority_levels and not 1 <= db.default_priority_level <= db.priority_levels:
            raise invalid(f"default priority level must be in range [1, {db.priority_levels}] for {name}")
        if db.preserve_ordering and db.priority_levels > 1:
            raise invalid(f"preserve_ordering is not supported with multiple priority levels for {name}")
    if config.response_cache.enable and (
        config.HasField("sequence_batching") or config.model_transaction_policy.decoupled
    ):
        raise invalid(
            f"response cache is not supported for model '{name}': it uses sequence batching "
            "or a decoupled transaction policy"
        )
    for group in config.instance_group:
        if group.kind in (pb.ModelInstanceGroup.KIND_CPU, pb.ModelInstanceGroup.KIND_MODEL) and group.gpus:
            kind = pb.ModelInstanceGroup.Kind.Name(group.kind)
            raise invalid(f"instance group {group.name} of model {name} has kind {kind} but specifies one or more GPUs")
    validate_model_metrics(config)


# ---------------------------------------------------------------------------
# Shoal's own view, built once from the published JSON.


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # protocol name
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    optional: bool = False
    allow_ragged_batch: bool = False

    @property
    def variable(self) -> bool:
        return -1 in self.dims


@dataclass(frozen=True)
class DynamicBatching:
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_us: int
    preserve_ordering: bool


@dataclass(frozen=True)
class ModelSpec:
    name: str
    platform: str
    backend: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    dynamic_batching: DynamicBatching | None
    instance_count: int
    instance_kind: str
    decoupled: bool
    default_model_filename: str
    response_cache: bool = False
    parameters: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict, repr=False)

    @cached_property
    def model_name(self) -> str:
        """The name clients know it by; `name` is its identity (with --model-namespacing,
        `<repository>::<name>`: shared.wire.records.model_key), which routes its requests."""
        return str(self.config.get("name", self.name))

    @property
    def metadata_platform(self) -> str:
        return self.platform or self.backend

    def input(self, name: str) -> TensorSpec | None:
        return self._inputs_by_name.get(name)

    def output(self, name: str) -> TensorSpec | None:
        return self._outputs_by_name.get(name)

    @cached_property
    def required_inputs(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs if not t.optional)

    def missing_inputs(self, given: list[str], prefix: str = "") -> ShoalError | None:
        """Triton's error for a request without one of the model's required inputs, or None."""
        required = self.required_inputs
        missing = [name for name in required if name not in given] if len(given) < len(self.inputs) else []
        if not missing:
            return None
        return invalid(
            f"{prefix}expected {len(required)} inputs but got {len(given)} inputs for model '{self.model_name}'. "
            f"Got input(s) {given}, but missing required input(s) {missing}. Please provide all required input(s)."
        )

    # looked up for every input and output of every request: built once per spec (the first of a name wins)
    @cached_property
    def _inputs_by_name(self) -> dict[str, TensorSpec]:
        return _by_name(self.inputs)

    @cached_property
    def _outputs_by_name(self) -> dict[str, TensorSpec]:
        return _by_name(self.outputs)


def _by_name(tensors: tuple[TensorSpec, ...]) -> dict[str, TensorSpec]:
    named: dict[str, TensorSpec] = {}
    for tensor in tensors:
        named.setdefault(tensor.name, tensor)
    return named


def _tensor(io: dict[str, Any]) -> TensorSpec:
    reshape = io.get("reshape")
    return TensorSpec(
        name=io["name"],
        datatype=config_to_protocol(io.get("data_type", "TYPE_INVALID")),
        dims=tuple(int(d) for d in io.get("dims", [])),
        reshape=tuple(int(d) for d in reshape.get("shape", [])) if reshape is not None else None,
        optional=bool(io.get("optional", False)),
        allow_ragged_batch=bool(io.get("allow_ragged_batch", False)),
    )


def spec_from_json(config: dict[str, Any], key: str = "") -> ModelSpec:
    """`key`: the model's identity where it is not its config's name (its record's name)."""
    db = config.get("dynamic_batching")
    groups = config.get("instance_group", [])
    kinds = {g.get("kind", "KIND_CPU") for g in groups}
    return ModelSpec(
        name=key or config["name"],
        platform=config.get("platform", ""),
        backend=config.get("backend", ""),
        max_batch_size=int(config.get("max_batch_size", 0)),
        inputs=tuple(_tensor(io) for io in config.get("input", [])),
        outputs=tuple(_tensor(io) for io in config.get("output", [])),
        dynamic_batching=DynamicBatching(
            preferred_batch_sizes=tuple(sorted(int(s) for s in db.get("preferred_batch_size", []))),
            max_queue_delay_us=int(db.get("max_queue_delay_microseconds", 0)),
            preserve_ordering=bool(db.get("preserve_ordering", False)),
        )
        if db is not None
        else None,
        instance_count=sum(int(g.get("count", 1)) for g in groups) or 1,
        instance_kind="KIND_GPU" if "KIND_GPU" in kinds else "KIND_CPU",
        decoupled=bool(config.get("model_transaction_policy", {}).get("decoupled", False)),
        default_model_filename=config.get("default_model_filename", ""),
        response_cache=bool(config.get("response_cache", {}).get("enable", False)),
        parameters={k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()},
        config=config,
    )


def load_error(model: str, exc: Exception) -> str:
    return exc.message if isinstance(exc, ShoalError) else f"{type(exc).__name__}: {exc}"

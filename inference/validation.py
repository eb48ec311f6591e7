"""A request checked against its model's config, as Triton's core normalizes it (§3.1)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from inference.types import InputTensor, ParsedRequest, expected_byte_size
from shared.config.model_config import ModelSpec, TensorSpec
from shared.errors import Code, ShoalError, invalid

_BATCH_NOTE = (
    " NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim in "
    "your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
    "more info on max_batch_size."
)


@dataclass(frozen=True)
class Validated:
    batch_size: int
    shape_sig: str  # shapes of variable-dim inputs and the set of inputs given
    outputs: list[str]  # requested output names (empty = all)
    binary: dict[str, bool]  # output name -> return as binary


def _fmt(dims: Iterable[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _shape_matches(dims: tuple[int, ...], shape: list[int]) -> bool:
    return len(dims) == len(shape) and all(d == -1 or d == s for d, s in zip(dims, shape))


def validate(
    spec: ModelSpec, request: ParsedRequest, streaming: bool = False, endpoint: str = "HTTP end point"
) -> Validated:
    """`streaming`: the endpoint can carry a decoupled model's many responses; `endpoint`: how
    Triton names the one that cannot (in the refusal's text)."""
    prefix = f"[request id: {request.id or '<id_unknown>'}] "
    if spec.decoupled and not streaming:
        raise ShoalError(f"{endpoint} doesn't support models with decoupled transaction policy", Code.UNSUPPORTED)
    configs = _input_configs(spec, request, prefix)
    batch_size = 0
    sig: list[str] = []
    for tensor in request.inputs:  # each input checked whole, in request order: Triton's first error
        config = configs[tensor.name]
        batch_size, item_shape = _check_shape(spec, tensor, config, batch_size, prefix)
        _check_byte_size(spec.model_name, tensor, prefix)
        if config.variable and not config.allow_ragged_batch:
            sig.append(f"{tensor.name}{item_shape}")
    if spec.max_batch_size > 0 and batch_size > spec.max_batch_size:
        raise invalid(f"{prefix}inference request batch-size must be <= {spec.max_batch_size} for '{spec.model_name}'")
    if len(request.inputs) != len(spec.inputs):  # optional inputs: only requests with the same inputs batch
        sig.append("|" + ",".join(sorted(t.name for t in request.inputs)))
    outputs, binary = _outputs(spec, request, prefix)
    return Validated(max(batch_size, 1), ";".join(sig), outputs, binary)


def _input_configs(spec: ModelSpec, request: ParsedRequest, prefix: str) -> dict[str, TensorSpec]:
    """Each input's config: no input twice, none the model lacks, every required one given."""
    model = spec.model_name
    given = [t.name for t in request.inputs]
    for duplicate in _duplicates(given):
        raise invalid(f"{prefix}input '{duplicate}' already exists in request")
    configs: dict[str, TensorSpec] = {}
    for tensor in request.inputs:
        known = spec.input(tensor.name)
        if known is None:
            raise invalid(f"{prefix}unexpected inference input '{tensor.name}' for model '{model}'")
        configs[tensor.name] = known
    if len(configs) < len(spec.inputs):
        missing = spec.missing_inputs(given, prefix)
        if missing is not None:
            raise missing
    return configs


def _check_shape(
    spec: ModelSpec, tensor: InputTensor, config: TensorSpec, batch_size: int, prefix: str
) -> tuple[int, list[int]]:
    """The input's datatype and shape against its config; the request's batch size so far (0:
    none yet) and the input's shape without it."""
    model = spec.model_name
    if tensor.datatype != config.datatype:
        raise invalid(
            f"{prefix}inference input '{tensor.name}' data-type is '{tensor.datatype}', "
            f"but model '{model}' expects '{config.datatype}'"
        )
    shape = tensor.shape
    if spec.max_batch_size > 0:
        if not shape:
            raise invalid(
                f"{prefix}unexpected shape for input '{tensor.name}' for model '{model}'. "
                f"Expected {_fmt((-1,) + config.dims)}, got {_fmt(shape)}.{_BATCH_NOTE}"
            )
        if batch_size == 0:
            batch_size = shape[0]
        elif shape[0] != batch_size:
            raise invalid(f"{prefix}input '{tensor.name}' batch size does not match other inputs for '{model}'")
        item_shape = shape[1:]
    else:
        item_shape = shape
    expected_dims = config.reshape if (config.reshape is not None and not config.dims) else config.dims
    if not _shape_matches(expected_dims, item_shape):
        shown = (-1,) + config.dims if spec.max_batch_size > 0 else config.dims
        note = _BATCH_NOTE if spec.max_batch_size > 0 else ""
        raise invalid(
            f"{prefix}unexpected shape for input '{tensor.name}' for model '{model}'. "
            f"Expected {_fmt(shown)}, got {_fmt(shape)}.{note}"
        )
    return batch_size, item_shape


def _check_byte_size(model: str, tensor: InputTensor, prefix: str) -> None:
    """The input's bytes (inline, or the shared-memory region's size) hold its shape."""
    shape = tensor.shape
    if tensor.data is None:  # in shared memory
        expected = expected_byte_size(tensor.datatype, shape, b"")[0]
        actual = tensor.parameters.get("shared_memory_byte_size", 0)
        if tensor.datatype == "BYTES":
            expected = actual  # element count is checked where the bytes are read
    else:
        expected, actual = expected_byte_size(tensor.datatype, shape, tensor.data)
    if expected == actual:
        return
    if tensor.datatype == "BYTES":
        raise invalid(
            f"{prefix}input byte size mismatch for input '{tensor.name}' for model '{model}'. "
            f"Expected {actual} bytes holding {_count(shape)} length-prefixed elements"
        )
    raise invalid(
        f"{prefix}input byte size mismatch for input '{tensor.name}' for model '{model}'. "
        f"Expected {expected}, got {actual}"
    )


def _count(shape: list[int]) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


def _outputs(spec: ModelSpec, request: ParsedRequest, prefix: str) -> tuple[list[str], dict[str, bool]]:
    if request.outputs is None:
        default = request.binary_data_output
        return [], {o.name: default for o in spec.outputs}
    for duplicate in _duplicates([o.name for o in request.outputs]):
        raise invalid(f"{prefix}output '{duplicate}' already exists in request")
    names, binary = [], {}
    for out in request.outputs:
        if spec.output(out.name) is None:
            raise invalid(f"{prefix}unexpected inference output '{out.name}' for model '{spec.model_name}'")
        names.append(out.name)
        binary[out.name] = bool(out.binary)
    return names, binary


def _duplicates(names: list[str]) -> list[str]:
    seen: set[str] = set()
    return [n for n in names if n in seen or seen.add(n)]  # type: ignore[func-returns-value]

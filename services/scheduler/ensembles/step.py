"""One ensemble step as an ordinary `InferRequest` to its composing model.

The step request is what a gateway would have sent for the same tensors: checked
against the member's config (Triton normalizes composing requests too, so a shape or
datatype the member does not take fails with the member's own text), with the batch
size and shape signature the member's batcher groups requests by, and the ensemble
request's parameters (sequence id/start/end included), priority, timeout, deadline and
client request id.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import msgspec

from shared.bus.dispatch import Dispatcher
from shared.config.ensemble_graph import Step
from shared.config.model_config import ModelSpec, TensorSpec
from shared.errors import invalid, not_found, unavailable
from shared.wire.messages import InferRequest, TensorRef


def _fmt(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def resolve_version(model: str, version: int, ready: Mapping[str, list[int]]) -> int:
    """-1: the member's latest READY version, as the gateway resolves an unversioned request."""
    versions = ready.get(model) or []
    if version == -1:
        if not versions:
            raise not_found(f"Request for unknown model: '{model}' has no available versions")
        return versions[-1]
    if version not in versions:
        raise unavailable(f"Request for unknown model: '{model}' version {version} is not at ready state")
    return version


def _matches(dims: Sequence[int], shape: list[int]) -> bool:
    return len(dims) == len(shape) and all(d == -1 or d == s for d, s in zip(dims, shape))


def fit_batching(dims: Sequence[int], batching: bool, shape: list[int], source_batched: bool) -> list[int]:
    """Triton's `ReshapeTensorDims`: a tensor from a non-batching model going to a batching one
    gets a batch dimension of 1; a batch of 1 going to a non-batching model loses it, when
    that is what makes the shape fit (only the shape changes: same bytes)."""
    if batching == source_batched:
        return list(shape)
    if batching and _matches(dims, shape):
        return [1] + list(shape)
    if not batching and not _matches(dims, shape) and shape[:1] == [1] and _matches(dims, shape[1:]):
        return list(shape[1:])
    return list(shape)


def _input(spec: ModelSpec, name: str, prefix: str) -> TensorSpec:
    """The member's input `name` (an ensemble config may map a tensor to one it does not have)."""
    config = spec.input(name)
    if config is None:
        raise invalid(f"{prefix}unexpected inference input '{name}' for model '{spec.model_name}'")
    return config


def _check(spec: ModelSpec, ref: TensorRef, prefix: str) -> tuple[int, list[int]]:
    """(batch size, per-item shape) of one input, or the member's validation error."""
    config = _input(spec, ref.name, prefix)
    if ref.datatype != config.datatype:
        raise invalid(
            f"{prefix}inference input '{ref.name}' data-type is '{ref.datatype}', "
            f"but model '{spec.model_name}' expects '{config.datatype}'"
        )
    shape = list(ref.shape)
    batched = spec.max_batch_size > 0
    item = shape[1:] if batched else shape
    dims = config.reshape if (config.reshape is not None and not config.dims) else config.dims
    if (batched and not shape) or len(dims) != len(item) or any(d != -1 and d != s for d, s in zip(dims, item)):
        shown = (-1,) + config.dims if batched else config.dims
        raise invalid(
            f"{prefix}unexpected shape for input '{ref.name}' for model '{spec.model_name}'. "
            f"Expected {_fmt(shown)}, got {_fmt(shape)}"
        )
    return (shape[0] if batched else 1), item


def _step_inputs(
    spec: ModelSpec, step: Step, tensors: Mapping[str, TensorRef | None], batched: dict[str, bool], prefix: str
) -> tuple[list[TensorRef], int, list[str]]:
    """The member's inputs (the same bytes under its names), their batch size, and the shape
    signature its batcher groups requests by; or the member's validation error."""
    inputs: list[TensorRef] = []
    batch_size = 0
    sig: list[str] = []
    for model_input, tensor in step.input_map.items():
        config = _input(spec, model_input, prefix)
        source = tensors.get(tensor)
        if source is None:  # absent: an optional ensemble input left out, or an output not produced
            continue
        dims = config.reshape if (config.reshape is not None and not config.dims) else config.dims
        shape = fit_batching(dims, spec.max_batch_size > 0, source.shape, batched.get(tensor, True))
        ref = msgspec.structs.replace(source, name=model_input, shape=shape)  # same bytes, the member's name
        size, item = _check(spec, ref, prefix)
        if batch_size and size != batch_size:
            raise invalid(
                f"{prefix}input '{model_input}' batch size does not match other inputs for '{spec.model_name}'"
            )
        batch_size = size
        if config.variable and not config.allow_ragged_batch:
            sig.append(f"{model_input}{item}")  # the gateway's format: equal shapes batch together
        inputs.append(ref)
    if spec.max_batch_size > 0 and batch_size > spec.max_batch_size:
        raise invalid(f"{prefix}inference request batch-size must be <= {spec.max_batch_size} for '{spec.model_name}'")
    if len(inputs) < len(step.input_map):  # Triton leaves an absent tensor out: the member says if it may be
        missing = spec.missing_inputs([ref.name for ref in inputs], prefix)
        if missing is not None:
            raise missing
    if len(inputs) != len(spec.inputs):
        sig.append("|" + ",".join(sorted(ref.name for ref in inputs)))
    return inputs, batch_size, sig


def step_request(
    request: InferRequest,
    step: Step,
    tensors: Mapping[str, TensorRef | None],
    batched: dict[str, bool],
    requested: list[str],
    readers: dict[str, int],
    specs: Mapping[str, ModelSpec],
    ready: Mapping[str, list[int]],
    dispatcher: Dispatcher,
) -> InferRequest:
    spec = specs.get(step.model)
    if spec is None:
        raise not_found(f"Request for unknown model: '{step.model}' is not found")
    version = resolve_version(step.model, step.version, ready)
    prefix = f"[request id: {request.id or '<id_unknown>'}] "
    inputs, batch_size, sig = _step_inputs(spec, step, tensors, batched, prefix)
    # only the outputs something reads; a client's output region goes straight to the producer
    # when nothing else reads the tensor (the worker writes it there, no copy here or at the gateway)
    outputs = [o for o, t in step.output_map.items() if t in requested or readers.get(t)]
    regions = {
        o: request.output_regions[t]
        for o, t in step.output_map.items()
        if t in request.output_regions and t in requested and not readers.get(t)
    }
    rid = dispatcher.new_rid()
    return InferRequest(
        rid=rid,
        model=step.model,
        version=version,
        reply=dispatcher.reply_subject(rid),
        deadline_ns=request.deadline_ns,
        batch_size=max(batch_size, 1),
        shape_sig=";".join(sig),
        id=request.id,
        inputs=inputs,
        outputs=outputs,
        output_regions=regions,
        parameters=request.parameters,
        priority=request.priority,
        timeout_us=request.timeout_us,
        sequence_id=request.sequence_id,  # a step on a sequence model continues the client's sequence
        sequence_start=request.sequence_start,
        sequence_end=request.sequence_end,
        received_ns=time.time_ns(),
        trace=True,  # the member's compute timestamps come back: the ensemble's statistics sum them
    )

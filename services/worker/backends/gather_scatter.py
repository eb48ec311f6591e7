"""Gathering requests into one batch and scattering the outputs back (pure numpy)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from services.worker.backends.batch_inputs import BatchInput, compute
from shared.config.model_config import ModelSpec


def gather(
    spec: ModelSpec, requests: list[dict[str, np.ndarray]], extra: Sequence[BatchInput] = ()
) -> dict[str, np.ndarray]:
    """Concatenate each input along the batch dimension and apply the config's `reshape`.

    A ragged input (`allow_ragged_batch`) reaches the model flat, every request's elements in
    order, as Triton's backends give it (its shapes differ from request to request); the config's
    batch inputs (`extra`, batch_inputs.py) say where each request's elements are."""
    batched: dict[str, np.ndarray] = compute(extra, requests, spec.max_batch_size > 0) if extra else {}
    for name in requests[0]:
        parts = [r[name] for r in requests]
        tensor = spec.input(name)
        if tensor is not None and tensor.allow_ragged_batch and spec.max_batch_size > 0:
            batched[name] = np.concatenate([part.reshape(-1) for part in parts])
            continue
        array = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        if tensor is not None and tensor.reshape is not None:
            lead = [array.shape[0]] if spec.max_batch_size > 0 else []
            array = array.reshape(lead + list(tensor.reshape))
        batched[name] = array
    return batched


def scatter(
    spec: ModelSpec,
    outputs: dict[str, np.ndarray],
    batch_sizes: list[int],
    inputs: list[dict[str, np.ndarray]] | None = None,
) -> list[dict[str, np.ndarray]]:
    """Split each output along the batch dimension, one slice per request, shaped as `dims`;
    an output named by a `batch_output { kind: BATCH_SCATTER_WITH_INPUT_SHAPE }` is split by the
    element counts of each request's source input and takes that input's shape (Triton's ragged
    batching: the model answered the flat batch)."""
    outputs = dict(outputs)
    by_input = _scatter_with_input_shape(spec, outputs, inputs or [])
    if spec.max_batch_size == 0 or len(batch_sizes) == 1:
        pieces = [dict(outputs)]
    else:
        bounds = np.cumsum(batch_sizes)[:-1]
        pieces = [{} for _ in batch_sizes]
        for name, array in outputs.items():
            for piece, part in zip(pieces, np.split(array, bounds, axis=0)):
                piece[name] = part
    for piece, size in zip(pieces, batch_sizes):
        for name, array in piece.items():
            tensor = spec.output(name)
            if tensor is not None and tensor.reshape is not None and -1 not in tensor.dims:
                lead = [size] if spec.max_batch_size > 0 else []
                piece[name] = array.reshape(lead + list(tensor.dims))
    for piece, scattered in zip(pieces, by_input):
        piece.update(scattered)
    return pieces


def _scatter_with_input_shape(
    spec: ModelSpec, outputs: dict[str, np.ndarray], inputs: list[dict[str, np.ndarray]]
) -> list[dict[str, np.ndarray]]:
    """The outputs Triton scatters by a source input's shapes, taken out of `outputs`."""
    per_request: list[dict[str, np.ndarray]] = [{} for _ in inputs]
    for rule in spec.config.get("batch_output", []):
        if rule.get("kind") != "BATCH_SCATTER_WITH_INPUT_SHAPE" or not inputs:
            continue
        source = rule["source_input"][0]
        shapes = [request[source].shape for request in inputs]
        bounds = np.cumsum([int(np.prod(shape)) for shape in shapes])[:-1]
        for target in rule.get("target_name", []):
            if target not in outputs:
                continue
            flat = outputs.pop(target).reshape(-1)
            for piece, part, shape in zip(per_request, np.split(flat, bounds), shapes):
                piece[target] = part.reshape(shape)
    return per_request

"""Gathering requests into one batch and scattering the outputs back (pure numpy)."""

from __future__ import annotations

import numpy as np

from shared.model_config import ModelSpec


def gather(spec: ModelSpec, requests: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenate each input along the batch dimension and apply the config's `reshape`."""
    batched: dict[str, np.ndarray] = {}
    for name in requests[0]:
        parts = [r[name] for r in requests]
        array = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        tensor = spec.input(name)
        if tensor is not None and tensor.reshape is not None:
            lead = [array.shape[0]] if spec.max_batch_size > 0 else []
            array = array.reshape(lead + list(tensor.reshape))
        batched[name] = array
    return batched


def scatter(spec: ModelSpec, outputs: dict[str, np.ndarray], batch_sizes: list[int]) -> list[dict[str, np.ndarray]]:
    """Split each output along the batch dimension, one slice per request, shaped as `dims`."""
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
    return pieces

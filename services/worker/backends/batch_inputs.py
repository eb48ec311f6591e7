"""Triton's batch inputs: tensors the server adds to a tensor backend's batch.

A ragged input reaches the model flat (`gather_scatter.py`), so the model needs to know where each
request's elements begin; Triton computes that when the batch is formed and feeds it as an extra
input named in the config (`batch_input { kind target_name data_type source_input }`), never sent
by a client. The kinds and their shapes are Triton's (model_config.proto, `BatchInput.Kind`):

- `BATCH_ELEMENT_COUNT`: each request's element count of the source input, shape [requests];
- `BATCH_ACCUMULATED_ELEMENT_COUNT`: their running sum, shape [requests];
- `BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO`: the same after a 0, shape [requests + 1];
- `BATCH_MAX_ELEMENT_COUNT_AS_SHAPE`: only its shape says something, [the largest count];
- `BATCH_ITEM_SHAPE`: each batch item's shape (without the batch dimension), [items, rank];
- `BATCH_ITEM_SHAPE_FLATTEN`: the same flat, [items * rank].

Element counts include the batch dimension, as Triton counts them (`ShapeWithBatchDim`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shared.config.datatypes import config_to_protocol, numpy_dtype
from shared.errors import invalid

KINDS = (
    "BATCH_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
    "BATCH_ITEM_SHAPE",
    "BATCH_ITEM_SHAPE_FLATTEN",
)


@dataclass(frozen=True)
class BatchInput:
    kind: str
    targets: tuple[str, ...]
    dtype: np.dtype
    source: str


def parse(config: Mapping[str, Any]) -> tuple[BatchInput, ...]:
    """The config's batch inputs; Triton's load error for a kind or data type it does not know."""
    rules = []
    for rule in config.get("batch_input", []):
        kind = str(rule.get("kind", "BATCH_ELEMENT_COUNT"))  # proto3's default: the enum's first value
        if kind not in KINDS:
            raise invalid(f"unexpected batch input kind '{kind}'")
        data_type = str(rule.get("data_type", "TYPE_INVALID"))
        try:
            dtype = numpy_dtype(config_to_protocol(data_type))
        except ValueError:
            raise invalid(f"unexpected batch input data type '{data_type}'") from None
        sources = list(rule.get("source_input", []))
        if not sources:
            raise invalid(f"batch input kind '{kind}' expects a source input")
        rules.append(BatchInput(kind, tuple(rule.get("target_name", [])), dtype, str(sources[0])))
    return tuple(rules)


def compute(
    rules: Sequence[BatchInput], requests: Sequence[Mapping[str, np.ndarray]], batching: bool
) -> dict[str, np.ndarray]:
    """Every rule's tensor, under each of its target names, for one batch of requests."""
    tensors: dict[str, np.ndarray] = {}
    for rule in rules:
        sources = [request[rule.source] for request in requests]
        value = _value(rule.kind, sources, batching).astype(rule.dtype, copy=False)
        for target in rule.targets:
            tensors[target] = value
    return tensors


def _value(kind: str, sources: Sequence[np.ndarray], batching: bool) -> np.ndarray:
    counts = np.array([source.size for source in sources], np.int64)
    if kind == "BATCH_ELEMENT_COUNT":
        return counts
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
        return np.cumsum(counts)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
        return np.concatenate([[0], np.cumsum(counts)])
    if kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
        return np.zeros(int(counts.max()), np.int64)  # Triton leaves the contents uninitialised
    items = [
        list(source.shape[1:]) if batching else list(source.shape)
        for source in sources
        for _ in range(source.shape[0] if batching and source.ndim else 1)
    ]
    shapes = np.array(items, np.int64).reshape(len(items), -1)
    return shapes.reshape(-1) if kind == "BATCH_ITEM_SHAPE_FLATTEN" else shapes

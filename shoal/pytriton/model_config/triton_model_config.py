"""The model config PyTriton generates from a binding (and clients read back from the server)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from shoal.pytriton.model_config.common import DeviceKind, DynamicBatcher


@dataclasses.dataclass
class ResponseCache:
    enable: bool


@dataclasses.dataclass
class TensorSpec:
    name: str
    shape: tuple
    dtype: Any
    optional: bool | None = False


@dataclasses.dataclass
class TritonModelConfig:
    model_name: str
    model_version: int = 1
    max_batch_size: int = 4
    batching: bool = True
    batcher: DynamicBatcher | None = None
    instance_group: dict[DeviceKind, int | None] = dataclasses.field(default_factory=dict)
    decoupled: bool = False
    backend_parameters: dict[str, str] = dataclasses.field(default_factory=dict)
    inputs: Sequence[TensorSpec] | None = None
    outputs: Sequence[TensorSpec] | None = None
    response_cache: ResponseCache | None = None

    @property
    def backend(self) -> str:
        return "python"

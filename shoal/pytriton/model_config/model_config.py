"""What `Triton.bind(config=...)` takes; PyTriton's defaults (batching on, max batch 4)."""

from __future__ import annotations

import dataclasses

from shoal.pytriton.model_config.common import DynamicBatcher


@dataclasses.dataclass
class ModelConfig:
    batching: bool = True
    max_batch_size: int = 4
    batcher: DynamicBatcher = dataclasses.field(default_factory=DynamicBatcher)
    response_cache: bool = False
    decoupled: bool = False

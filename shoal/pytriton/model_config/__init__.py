"""PyTriton's model configuration API (`from shoal.pytriton.model_config import ModelConfig, Tensor`)."""

from shoal.pytriton.model_config.common import (
    DeviceKind,
    DynamicBatcher,
    ModelWarmup,
    QueuePolicy,
    TimeoutAction,
    WarmupInput,
)
from shoal.pytriton.model_config.model_config import ModelConfig
from shoal.pytriton.model_config.tensor import Tensor

__all__ = [
    "DeviceKind",
    "DynamicBatcher",
    "ModelConfig",
    "ModelWarmup",
    "QueuePolicy",
    "Tensor",
    "TimeoutAction",
    "WarmupInput",
]

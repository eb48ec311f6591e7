"""A model's config as the server returns it (JSON) -> PyTriton's `TritonModelConfig` (clients)."""

from __future__ import annotations

from typing import Any

import numpy as np
from tritonclient.utils import triton_to_np_dtype

from shoal.pytriton.exceptions import PyTritonModelConfigError
from shoal.pytriton.model_config.common import DeviceKind, DynamicBatcher, QueuePolicy, TimeoutAction
from shoal.pytriton.model_config.triton_model_config import ResponseCache, TensorSpec, TritonModelConfig


def _tensor(item: dict, io_type: str, index: int) -> TensorSpec:
    name = item.get("name")
    if not name:
        raise PyTritonModelConfigError(f"Name for {io_type} at index {index} not provided.")
    data_type = item.get("data_type")
    if not data_type:
        raise PyTritonModelConfigError(f"Data type for {io_type} with name `{name}` not defined.")
    kind = data_type.split("_", 1)[-1]
    dtype: Any = np.bytes_ if kind == "STRING" else triton_to_np_dtype(kind)
    if dtype is None:
        raise PyTritonModelConfigError(f"Unsupported data type `{data_type}` for {io_type} with name `{name}`")
    dims = item.get("dims", [])
    return TensorSpec(name=name, shape=tuple(int(d) for d in dims), dtype=dtype, optional=item.get("optional", False))


def _policy(config: dict) -> QueuePolicy:
    return QueuePolicy(
        timeout_action=TimeoutAction(config.get("timeout_action", "REJECT")),
        default_timeout_microseconds=int(config.get("default_timeout_microseconds", 0)),
        allow_timeout_override=bool(config.get("allow_timeout_override", False)),
        max_queue_size=int(config.get("max_queue_size", 0)),
    )


def _batcher(config: dict) -> DynamicBatcher:
    default = config.get("default_queue_policy")
    priority = config.get("priority_queue_policy")
    return DynamicBatcher(
        preferred_batch_size=config.get("preferred_batch_size"),
        max_queue_delay_microseconds=int(config.get("max_queue_delay_microseconds", 0)),
        preserve_ordering=bool(config.get("preserve_ordering", False)),
        priority_levels=int(config.get("priority_levels", 0)),
        default_priority_level=int(config.get("default_priority_level", 0)),
        default_queue_policy=_policy(default) if default else None,
        priority_queue_policy={int(k): _policy(v) for k, v in priority.items()} if priority else None,
    )


class ModelConfigParser:
    @classmethod
    def from_dict(cls, config: dict) -> TritonModelConfig:
        parameters = config.get("parameters") or {}
        cache = config.get("response_cache")
        return TritonModelConfig(
            model_name=config["name"],
            batching=config.get("max_batch_size", 0) > 0,
            max_batch_size=config.get("max_batch_size", 0),
            batcher=_batcher(config["dynamic_batching"]) if config.get("dynamic_batching") is not None else None,
            inputs=[_tensor(item, "input", i) for i, item in enumerate(config.get("input", []))] or None,
            outputs=[_tensor(item, "output", i) for i, item in enumerate(config.get("output", []))] or None,
            instance_group={
                DeviceKind(g["kind"]): g.get("count") for g in config.get("instance_group", []) if "kind" in g
            },
            decoupled=bool((config.get("model_transaction_policy") or {}).get("decoupled", False)),
            backend_parameters={k: (v or {}).get("string_value", "") for k, v in parameters.items()},
            response_cache=ResponseCache(enable=bool(cache["enable"])) if cache else None,
        )

"""A binding's `TritonModelConfig` -> the `config.pbtxt` PyTriton generates for it.

Field for field what PyTriton's generator writes (`backend: "python"`, the dynamic batcher
only when batching, one KIND_CPU instance group with a count of one per bound function, the
decoupled transaction policy, the response cache), with one difference: PyTriton's
`workspace-path` parameter (where its proxy sockets live) is Shoal's `shoal-in-process`
parameter, which tells the cluster's workers that only the binding process serves the model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import np_to_triton_dtype

from shoal.pytriton.exceptions import PyTritonBadParameterError
from shoal.pytriton.model_config.common import DynamicBatcher, QueuePolicy
from shoal.pytriton.model_config.triton_model_config import TensorSpec, TritonModelConfig

BYTES_TYPES = (np.object_, object, bytes, np.bytes_)


def triton_dtype(dtype: Any) -> str:
    """numpy dtype (or type) -> `TYPE_...` (`bytes`/`object` are `TYPE_STRING`)."""
    if dtype in BYTES_TYPES:
        return "TYPE_STRING"
    return f"TYPE_{np_to_triton_dtype(np.dtype(dtype))}"


def _queue_policy(policy: QueuePolicy) -> dict:
    return {
        "timeoutAction": policy.timeout_action.value,
        "defaultTimeoutMicroseconds": int(policy.default_timeout_microseconds),
        "allowTimeoutOverride": policy.allow_timeout_override,
        "maxQueueSize": int(policy.max_queue_size),
    }


def _dynamic_batching(batcher: DynamicBatcher) -> dict:
    config: dict[str, Any] = {}
    if batcher.max_queue_delay_microseconds > 0:
        config["maxQueueDelayMicroseconds"] = int(batcher.max_queue_delay_microseconds)
    if batcher.preferred_batch_size:
        config["preferredBatchSize"] = [int(size) for size in batcher.preferred_batch_size]
    if batcher.preserve_ordering:
        config["preserveOrdering"] = batcher.preserve_ordering
    if batcher.priority_levels:
        config["priorityLevels"] = batcher.priority_levels
    if batcher.default_priority_level:
        if batcher.default_priority_level > batcher.priority_levels:
            raise PyTritonBadParameterError(
                f"The `default_priority_level` must be between 1 and {batcher.priority_levels}."
            )
        config["defaultPriorityLevel"] = batcher.default_priority_level
    if batcher.default_queue_policy:
        config["defaultQueuePolicy"] = _queue_policy(batcher.default_queue_policy)
    if batcher.priority_queue_policy:
        if not batcher.priority_levels:
            raise PyTritonBadParameterError(
                "Provide the `priority_levels` if you want to define `priority_queue_policy` for Dynamic Batching."
            )
        for priority in batcher.priority_queue_policy:
            if priority < 0 or priority > batcher.priority_levels:
                raise PyTritonBadParameterError(
                    f"Invalid `priority`={priority} provided. The value must be between 1 and {batcher.priority_levels}."
                )
        config["priorityQueuePolicy"] = {p: _queue_policy(q) for p, q in batcher.priority_queue_policy.items()}
    return config


def _io(spec: TensorSpec) -> dict:
    item: dict[str, Any] = {"name": spec.name, "dims": list(spec.shape), "data_type": triton_dtype(spec.dtype)}
    if spec.optional:
        item["optional"] = True
    return item


class ModelConfigGenerator:
    def __init__(self, config: TritonModelConfig) -> None:
        self._config = config

    def get_config(self) -> dict:
        """The config as protobuf JSON (what the load request's `config` parameter carries)."""
        c = self._config
        model: dict[str, Any] = {"name": c.model_name, "backend": c.backend}
        if not c.batching:
            model["max_batch_size"] = 0
        elif c.max_batch_size < 1:
            raise PyTritonBadParameterError("The `max_batch_size` must be greater or equal to 1.")
        else:
            model["max_batch_size"] = c.max_batch_size
            if isinstance(c.batcher, DynamicBatcher):
                model["dynamic_batching"] = _dynamic_batching(c.batcher)
        if c.inputs:
            model["input"] = [_io(spec) for spec in c.inputs]
        if c.outputs:
            outputs = [_io(spec) for spec in c.outputs]
            optional = [o["name"] for o in outputs if o.get("optional")]
            if optional:
                raise PyTritonBadParameterError(
                    f"Optional flag for outputs is not supported. Outputs marked as optional: {', '.join(optional)}."
                )
            model["output"] = outputs
        groups = [{"count": count, "kind": kind.value} for kind, count in c.instance_group.items()]
        if groups:
            model["instance_group"] = groups
        if c.decoupled:
            model["model_transaction_policy"] = {"decoupled": True}
        if c.backend_parameters:
            model["parameters"] = {k: {"string_value": str(v)} for k, v in c.backend_parameters.items()}
        if c.response_cache:
            model["response_cache"] = {"enable": c.response_cache.enable}
        return model

    def to_message(self) -> model_config_pb2.ModelConfig:
        return json_format.ParseDict(self.get_config(), model_config_pb2.ModelConfig())

    def to_text(self) -> str:
        """`config.pbtxt` as PyTriton writes it (`max_batch_size: 0` spelled out, as Triton needs)."""
        config = self.get_config()
        text = text_format.MessageToString(self.to_message())
        if config["max_batch_size"] == 0:
            text += "max_batch_size: 0\n"
        return text

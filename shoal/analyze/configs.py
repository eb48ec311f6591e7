"""A candidate configuration: the few fields the search varies, applied to the model's own config."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2


@dataclass(frozen=True)
class Candidate:
    instances: int
    max_batch_size: int
    dynamic_batching: bool
    max_queue_delay_us: int = 0
    preferred_batch_size: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        if not self.dynamic_batching:
            return f"i{self.instances}_b{self.max_batch_size}"
        preferred = "_p" + "-".join(map(str, self.preferred_batch_size)) if self.preferred_batch_size else ""
        return f"i{self.instances}_b{self.max_batch_size}_db{self.max_queue_delay_us}{preferred}"


def candidate_of(config: dict) -> Candidate:
    """The model's configuration as it is now, in the search's terms."""
    groups = config.get("instance_group") or [{"count": 1}]
    batching = config.get("dynamic_batching")
    return Candidate(
        instances=sum(int(g.get("count", 1)) for g in groups),
        max_batch_size=int(config.get("max_batch_size", 0)),
        dynamic_batching=batching is not None,
        max_queue_delay_us=int((batching or {}).get("max_queue_delay_microseconds", 0)),
        preferred_batch_size=tuple(int(b) for b in (batching or {}).get("preferred_batch_size", [])),
    )


def apply(config: dict, candidate: Candidate) -> dict:
    """The model's config with the candidate's fields: everything else (I/O, backend, policies) kept."""
    new = copy.deepcopy(config)
    groups = new.get("instance_group") or [{"kind": "KIND_CPU"}]
    first = dict(groups[0])
    first["count"] = candidate.instances
    new["instance_group"] = [first]  # one group: the count is the whole model's
    new["max_batch_size"] = candidate.max_batch_size
    if candidate.dynamic_batching:
        batching = dict(new.get("dynamic_batching") or {})
        batching["max_queue_delay_microseconds"] = candidate.max_queue_delay_us
        batching["preferred_batch_size"] = list(candidate.preferred_batch_size)
        new["dynamic_batching"] = batching
    else:
        new.pop("dynamic_batching", None)
    return new


def to_pbtxt(config: dict) -> str:
    """config.pbtxt text via Triton's ModelConfig message (the server's JSON uses its field names)."""
    message = json_format.ParseDict(config, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
    return text_format.MessageToString(message)

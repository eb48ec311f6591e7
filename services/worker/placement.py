"""Triton's `instance_group` as a list of instances: name, kind and device of each.

A worker turns every group of the published config into instances the way Triton's
`SetInstances` does: KIND_CPU/KIND_MODEL give `count` instances, KIND_GPU gives `count`
instances per listed GPU (all of this worker's GPUs when none are listed). A KIND_GPU
group on a worker without the GPUs it needs fails the load with Triton's reasons; it is
never moved to the CPU behind the user's back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.worker.gpus import available_gpus
from shared.errors import ShoalError, unavailable


@dataclass(frozen=True)
class InstancePlan:
    name: str  # Triton's instance name: the group's, with `_<c>` when the group has several
    group: str
    kind: str  # KIND_CPU, KIND_GPU or KIND_MODEL
    device: int  # the CUDA device of a KIND_GPU instance; 0 otherwise, as Triton reports it


def plan_instances(config: dict[str, Any], gpus: Sequence[int]) -> list[InstancePlan]:
    """Every instance of every group, in group order (so index i is stable across workers)."""
    model = config["name"]
    groups = config.get("instance_group") or [{"name": model, "count": 1, "kind": "KIND_AUTO"}]
    plans: list[InstancePlan] = []
    for index, group in enumerate(groups):
        name = group.get("name") or (model if len(groups) == 1 else f"{model}_{index}")
        count = max(1, int(group.get("count", 1)))
        kind = group.get("kind", "KIND_AUTO")
        listed = [int(g) for g in group.get("gpus", [])]
        if kind == "KIND_AUTO":  # Triton: GPU when GPUs are listed or available, else CPU
            kind = "KIND_GPU" if listed or gpus else "KIND_CPU"
        if kind != "KIND_GPU":
            plans += [InstancePlan(_instance_name(name, c, count), name, kind, 0) for c in range(count)]
            continue
        devices = listed or list(gpus)
        if not devices:
            raise unavailable(
                f"instance group {name} of model {model} has kind KIND_GPU but no GPUs are available "
                "on this worker (Shoal does not move GPU instances to the CPU)"
            )
        for gpu in devices:
            if gpu not in gpus:
                shown = ", ".join(str(g) for g in gpus) or "none"
                raise unavailable(
                    f"instance group {name} of model {model} specifies invalid or unsupported gpu id {gpu}. "
                    f"GPUs available to this worker are: {shown}"
                )
        plans += [
            InstancePlan(_instance_name(name, c, count), name, kind, gpu) for c in range(count) for gpu in devices
        ]
    return plans


def _instance_name(group: str, c: int, count: int) -> str:
    return f"{group}_{c}" if count > 1 else group


def group_size(config: dict[str, Any]) -> int:
    """How many instances the model's config asks for on this host (at least 1: a config whose
    groups cannot be placed fails in the instance that tries, with the reason)."""
    try:
        return max(1, len(plan_instances(config, available_gpus())))
    except ShoalError:
        return 1

"""Triton's rate limiter (`--rate-limit execution_count`, docs/triton-spec.md §3.6).

An instance runs a batch only when the resources its `instance_group.rate_limiter` asks
for are free: per device (here, per worker) or `global` across all of them. Pools hold
what `--rate-limit-resource name:count[:device]` says, or by default the most any single
instance needs. Among instances that could run, `priority` weighs the chances: priority 2
gets half the executions of priority 1.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

GLOBAL = "<global>"
RunKey = tuple[str, tuple[str, int], int]  # (worker, (model, version), instance)


@dataclass(frozen=True)
class Need:
    resources: tuple[tuple[str, bool, int], ...] = ()  # (name, global, count)
    priority: int = 1


def instance_needs(config: dict[str, Any]) -> list[Need]:
    """Per instance index (groups in order, `count` instances each) what it needs to run."""
    needs: list[Need] = []
    for group in config.get("instance_group", []):
        limiter = group.get("rate_limiter", {})
        resources = tuple(
            (r["name"], bool(r.get("global", False)), int(r.get("count", 0))) for r in limiter.get("resources", [])
        )
        need = Need(resources, max(1, int(limiter.get("priority", 0)) or 1))
        # a KIND_GPU group has `count` instances per listed GPU (services/worker/placement.py); with
        # no GPUs listed the worker uses all of its own, unknown here: later indices get no needs
        per_gpu = len(group.get("gpus", [])) if group.get("kind") == "KIND_GPU" else 0
        needs += [need] * (int(group.get("count", 1)) * max(1, per_gpu))
    return needs


def parse_resources(flags: list[str]) -> dict[tuple[str, str], int]:
    """`name:count[:device]` -> {(name, device or ""): count}."""
    pools: dict[tuple[str, str], int] = {}
    for flag in flags:
        parts = flag.split(":")
        if len(parts) not in (2, 3) or not parts[1].isdigit():
            raise ValueError(f"--rate-limit-resource '{flag}': expected <name>:<count>[:<device>]")
        pools[(parts[0], parts[2] if len(parts) == 3 else "")] = int(parts[1])
    return pools


@dataclass
class RateLimiter:
    enabled: bool = False
    configured: dict[tuple[str, str], int] = field(default_factory=dict)  # from the flags
    defaults: dict[str, int] = field(default_factory=dict)  # resource -> the most one instance needs
    in_use: Counter[tuple[str, str]] = field(default_factory=Counter)  # (resource, device) -> count held
    runs: Counter[RunKey] = field(default_factory=Counter)  # (worker, model, instance) -> batches started

    def learn(self, needs: list[Need]) -> None:
        for need in needs:
            for name, _, count in need.resources:
                self.defaults[name] = max(self.defaults.get(name, 0), count)

    def _capacity(self, name: str, device: str) -> int:
        if (name, device) in self.configured:
            return self.configured[(name, device)]
        if (name, "") in self.configured:
            return self.configured[(name, "")]
        return self.defaults.get(name, 0)

    @staticmethod
    def _pool(name: str, is_global: bool, worker: str) -> str:
        return GLOBAL if is_global else worker

    def can_run(self, need: Need, worker: str) -> bool:
        if not self.enabled:
            return True
        return all(
            self.in_use[(name, self._pool(name, g, worker))] + count
            <= self._capacity(name, self._pool(name, g, worker) if not g else "")
            for name, g, count in need.resources
        )

    def acquire(self, need: Need, worker: str, run_key: RunKey) -> None:
        self.runs[run_key] += 1
        if self.enabled:
            for name, g, count in need.resources:
                self.in_use[(name, self._pool(name, g, worker))] += count

    def release(self, need: Need, worker: str) -> None:
        if self.enabled:
            for name, g, count in need.resources:
                self.in_use[(name, self._pool(name, g, worker))] -= count

    def weight(self, need: Need, run_key: RunKey) -> int:
        """Lower goes first: batches already started, scaled by the instance's priority."""
        return self.runs[run_key] * need.priority

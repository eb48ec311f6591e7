"""With --model-namespacing: which repository an ensemble's step models come from.

Triton's dependency graph (core's `ConnectDependencyGraph`) connects an ensemble's step to the
model of that name in the ensemble's own repository, else to the one model of that name in
another; where none or several hold it, the ensemble is not connected (UNAVAILABLE, Triton's
text in `model_states.not_connected`). Without namespacing every namespace is '' and nothing here
changes a step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from services.repository.ensembles import member_namespaces
from services.repository.repositories import Scan
from shared.wire.records import ModelRecord


def known(scan: Scan, records: Iterable[ModelRecord]) -> dict[str, list[str]]:
    """Name -> the namespaces holding a model of that name (Triton's global map): every
    repository's models, and those loaded from elsewhere (an override's files)."""
    found: dict[str, set[str]] = {}
    for located in scan.models.values():
        found.setdefault(located.name, set()).add(located.namespace)
    for record in records:
        if record.hosted:
            found.setdefault(record.model_name, set()).add(record.namespace)
    return {name: sorted(namespaces) for name, namespaces in found.items()}


def connect(steps: list[dict[str, Any]], namespace: str, holders: dict[str, list[str]]) -> tuple[bool, list[str]]:
    """Each step's `model_namespace` set to the one its model is taken from (an ensemble's config
    as JSON, changed in place): whether any changed, and the names no repository resolves."""
    chosen = member_namespaces(namespace, [step["model_name"] for step in steps], holders)
    changed = False
    for step, found in zip(steps, chosen):
        if (found or "") != step.get("model_namespace", ""):
            changed = True
            if found:
                step["model_namespace"] = found
            else:
                step.pop("model_namespace", None)
    return changed, [step["model_name"] for step, found in zip(steps, chosen) if found is None]


def reconnect(record: ModelRecord, scan: Scan, records: Mapping[str, ModelRecord]) -> tuple[bool, list[str]]:
    """An ensemble's record connected again (`connect` on its config): one of its steps' models
    may have gone from its own repository, or come back."""
    steps = record.config.get("ensemble_scheduling", {}).get("step", [])
    return connect(steps, record.namespace, known(scan, records.values()))

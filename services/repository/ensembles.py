"""Ensemble readiness: an ensemble has no instances; its state follows its composing models.

Triton's rule (docs/triton-spec.md §3.5): an ensemble is READY when every composing model it names is
READY (at the version the step asks for), and its graph is consistent with their configs.
It becomes UNAVAILABLE, with the reason, when one of them is not, and READY again when it
is back. The structural checks that need no other model run once at load (a bad graph is
a load failure, like a bad config); the checks against member configs run here, each time
a member changes, because the members can change without the ensemble being reloaded.
"""

from __future__ import annotations

from typing import TypeGuard

from shared.config.ensemble_graph import check_members, graph_from_config, is_ensemble
from shared.wire.records import ModelRecord, ModelState, ModelVersionState


def record_is_ensemble(record: ModelRecord | None) -> TypeGuard[ModelRecord]:
    return record is not None and is_ensemble(record.active_config)


def members_of(record: ModelRecord) -> list[str]:
    return graph_from_config(record.active_config).members


def _member_ready(record: ModelRecord | None, version: int) -> bool:
    if record is None or not record.hosted:
        return False
    if version == -1:
        return record.any_version(ModelState.READY)
    state = record.versions.get(str(version))
    return state is not None and state.state == ModelState.READY


def _member_loading(record: ModelRecord | None, available: bool) -> bool:
    if record is None:
        return available  # in the repository, not loaded yet: it is about to be
    return not record.reason and record.any_version(ModelState.LOADING)


def ensemble_state(record: ModelRecord, records: dict[str, ModelRecord], available: set[str]) -> ModelVersionState:
    """The state of every version of an ensemble, derived from its members' records."""
    name = record.name
    graph = graph_from_config(record.active_config)
    loading = False
    for step in graph.steps:
        member = records.get(step.model)
        if _member_ready(member, step.version):
            continue
        if _member_loading(member, step.model in available):
            loading = True
            continue
        if member is not None and member.reason:
            return ModelVersionState(
                ModelState.UNAVAILABLE, f"ensemble '{name}' depends on '{step.model}' which is not valid"
            )
        if step.version != -1 and member is not None and member.hosted:
            return ModelVersionState(
                ModelState.UNAVAILABLE,
                f"ensemble '{name}' depends on '{step.model}' whose required version {step.version} is not loaded",
            )
        return ModelVersionState(
            ModelState.UNAVAILABLE, f"ensemble '{name}' depends on '{step.model}' which has no loaded version"
        )
    if loading:
        return ModelVersionState(ModelState.LOADING)
    error = check_members(record.active_config, {m: records[m].active_config for m in graph.members})
    if error:
        return ModelVersionState(ModelState.UNAVAILABLE, error)
    return ModelVersionState(ModelState.READY)


def cycle(name: str, records: dict[str, ModelRecord], config: dict) -> str:
    """Triton refuses ensembles that contain themselves through nested ensembles."""
    path = [name]

    def visit(cfg: dict) -> bool:
        for member in graph_from_config(cfg).members:
            if member in path:
                path.append(member)
                return True
            record = records.get(member)
            if record_is_ensemble(record):
                path.append(member)
                if visit(record.active_config):
                    return True
                path.pop()
        return False

    if visit(config):
        return "circular dependency between ensembles: " + " -> ".join(path)
    return ""


def dependents(name: str, records: dict[str, ModelRecord]) -> list[str]:
    """Ensembles that name `name` as a step model."""
    return [n for n, r in records.items() if record_is_ensemble(r) and r.hosted and name in members_of(r)]


def member_names(record: ModelRecord) -> list[str]:
    """The names its steps give their models (with namespacing, each may be in several repositories)."""
    return list(dict.fromkeys(step.name for step in graph_from_config(record.active_config).steps))


def member_namespaces(namespace: str, names: list[str], known: dict[str, list[str]]) -> list[str | None]:
    """With namespacing, the namespace each step's model is taken from, as Triton's dependency graph
    connects an ensemble (`ConnectDependencyGraph`): the ensemble's own namespace where it holds a
    model of that name, else the one namespace that does; None where none does or several do.
    `known`: name -> the namespaces holding a model of that name."""
    chosen: list[str | None] = []
    for name in names:
        holding = known.get(name, [])
        if namespace in holding:
            chosen.append(namespace)
        else:
            chosen.append(holding[0] if len(holding) == 1 else None)
    return chosen


def not_connected(name: str, unresolved: list[str]) -> str:
    """Triton's reason for an ensemble whose step models it cannot tell apart or find."""
    return f"ensemble {name} contains models that are not available or ambiguous: {', '.join(unresolved)}"

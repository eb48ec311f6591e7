"""Ensembles as the repository sees them: which records are ensembles, the models their steps
name (with namespacing, in which repository), the ensembles that name a model, and Triton's
refusal of ensembles that contain themselves.

An ensemble has no instances; its state follows its composing models (Triton's rule,
docs/triton-spec.md §3.5), and the state machine (model_states.py, `ensemble`) decides it each
time a member changes, because the members can change without the ensemble being reloaded. The
structural checks that need no other model run once at load (a bad graph is a load failure,
like a bad config).
"""

from __future__ import annotations

from typing import TypeGuard

from shared.config.ensemble_graph import graph_from_config, is_ensemble
from shared.wire.records import ModelRecord


def record_is_ensemble(record: ModelRecord | None) -> TypeGuard[ModelRecord]:
    return record is not None and is_ensemble(record.active_config)


def members_of(record: ModelRecord) -> list[str]:
    return graph_from_config(record.active_config).members


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

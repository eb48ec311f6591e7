"""A model version's state machine, as pure functions: every state a version moves to, why, and
when (docs/models.md). The states are Triton's (`ModelState`, on the wire in
shared/wire/records.py); everything that changes a version's state asks this module for the
new one, and `tests/test_layout.py` checks that nothing else makes a `ModelVersionState`.

    (new) ──load──▶ LOADING ──reports: an instance serves──▶ READY
                      │  └──reports: every worker failed──▶ UNAVAILABLE (the backend's reason)
                      └──the config failed──▶ UNAVAILABLE (the config's error)
    READY ──reload──▶ READY (it serves until the new generation swaps in)
    READY ──its instances died with their workers──▶ UNAVAILABLE (NO_INSTANCES)
    any ──unload──▶ UNLOADING ──drained──▶ UNAVAILABLE (UNLOADED); reports leave UNLOADING alone
    an ensemble: READY when every member is, LOADING while one loads, else UNAVAILABLE (why)
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.config.ensemble_graph import check_members, graph_from_config
from shared.wire.records import UNLOADED, InstanceRecord, ModelRecord, ModelState, ModelVersionState

NO_INSTANCES = "no worker hosts an instance of this model version any more"

LOADING = ModelVersionState(ModelState.LOADING)
READY = ModelVersionState(ModelState.READY)
UNLOADING = ModelVersionState(ModelState.UNLOADING)
DROPPED = ModelVersionState(ModelState.UNAVAILABLE, UNLOADED)  # unloaded on purpose, not a failure


def unavailable(reason: str) -> ModelVersionState:
    return ModelVersionState(ModelState.UNAVAILABLE, reason)


# -- a load ------------------------------------------------------------------------------
def loaded(hosted: Iterable[int], previous: dict[str, ModelVersionState]) -> dict[str, ModelVersionState]:
    """The versions after a load of `hosted`: each LOADING (a READY one stays READY: it serves until
    the swap), and the previous ones no longer hosted UNAVAILABLE, unloaded."""
    hosted = list(hosted)
    versions = {key: DROPPED for key in previous if int(key) not in hosted}
    for version in hosted:
        state = previous.get(str(version))
        versions[str(version)] = state if state is not None and state.state == ModelState.READY else LOADING
    return versions


def failed_load(versions: Iterable[int], error: str) -> dict[str, ModelVersionState]:
    """A load whose config failed: every version it named UNAVAILABLE with the error (version 1
    when it named none)."""
    return {str(v): unavailable(error) for v in list(versions) or [1]}


# -- an unload -------------------------------------------------------------------------
def unloading(hosted: Iterable[int]) -> dict[str, ModelVersionState]:
    """An unload's first step: gateways stop routing to the versions while they drain."""
    return {str(v): UNLOADING for v in hosted}


def unloaded(hosted: Iterable[int]) -> dict[str, ModelVersionState]:
    """An unload's last step, once the versions drained."""
    return {str(v): DROPPED for v in hosted}


# -- the workers' reports --------------------------------------------------------------
def from_reports(reports: list[InstanceRecord], generation: int, previous: ModelVersionState) -> ModelVersionState:
    """A version's state from the workers' reports on it: READY while any instance serves (the
    previous generation's too), UNAVAILABLE when every worker failed this generation or the
    instances of a READY version died with their workers, else LOADING."""
    if any(r.serving_generation > 0 for r in reports):
        return READY
    current = [r for r in reports if r.generation == generation]
    failed = [r for r in current if r.state == ModelState.UNAVAILABLE]
    if current and len(failed) == len(current):
        return unavailable(failed[0].reason)
    if not reports and (previous.state == ModelState.READY or previous.reason == NO_INSTANCES):
        return unavailable(NO_INSTANCES)  # every instance died with its worker
    return LOADING


def follow(previous: ModelVersionState | None, derived: ModelVersionState) -> ModelVersionState:
    """A version's next state when its reports or members change: what they say, except while it
    is UNLOADING, which only the unload ends."""
    return previous if previous is not None and previous.state == ModelState.UNLOADING else derived


def reports_settled(reports: list[InstanceRecord], generation: int) -> bool:
    """Every worker that reported has finished trying `generation` (and one did)."""
    return bool(reports) and all(r.generation == generation and r.state != ModelState.LOADING for r in reports)


def settled(versions: Iterable[ModelVersionState]) -> bool:
    return all(s.state != ModelState.LOADING for s in versions)


def first_failure(versions: Iterable[ModelVersionState]) -> str | None:
    """Why the first version that is not READY is not (None: all are)."""
    return next((s.reason for s in versions if s.state != ModelState.READY), None)


# -- an ensemble -----------------------------------------------------------------------
def not_connected(name: str, unresolved: list[str]) -> ModelVersionState:
    """Triton's state of an ensemble whose step models it cannot tell apart or find."""
    return unavailable(f"ensemble {name} contains models that are not available or ambiguous: {', '.join(unresolved)}")


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


def _member_missing(name: str, model: str, version: int, member: ModelRecord | None) -> ModelVersionState:
    if member is not None and member.reason:
        return unavailable(f"ensemble '{name}' depends on '{model}' which is not valid")
    if version != -1 and member is not None and member.hosted:
        return unavailable(f"ensemble '{name}' depends on '{model}' whose required version {version} is not loaded")
    return unavailable(f"ensemble '{name}' depends on '{model}' which has no loaded version")


def ensemble(record: ModelRecord, records: dict[str, ModelRecord], available: set[str]) -> ModelVersionState:
    """The state of every version of an ensemble, from its members' records (Triton's rule,
    docs/triton-spec.md §3.5): READY when every member is READY at the version its step asks for
    and the graph fits their configs, LOADING while one loads, else UNAVAILABLE with why.
    `available`: the models the repositories hold."""
    graph = graph_from_config(record.active_config)
    loading = False
    for step in graph.steps:
        member = records.get(step.model)
        if _member_ready(member, step.version):
            continue
        if _member_loading(member, step.model in available):
            loading = True
            continue
        return _member_missing(record.name, step.model, step.version, member)
    if loading:
        return LOADING
    error = check_members(record.active_config, {m: records[m].active_config for m in graph.members})
    return unavailable(error) if error else READY

"""What a model's record and its versions' states become, as pure functions: the record a load
publishes (`next_record`) and a version's state from the workers' reports (`derive_state`).
The manager (`manager.py`) scans, publishes and waits; it decides nothing of this itself."""

from __future__ import annotations

from services.repository.scan import ScannedModel
from shared.config import model_config
from shared.config.ensemble_graph import is_ensemble
from shared.errors import invalid
from shared.wire.records import UNLOADED, InstanceRecord, ModelRecord, ModelState, ModelVersionState

NO_INSTANCES = "no worker hosts an instance of this model version any more"


def derive_state(reports: list[InstanceRecord], generation: int, previous: ModelVersionState) -> ModelVersionState:
    """A version's state from the workers' reports on it: READY while any instance serves (the
    previous generation's too), UNAVAILABLE when every worker failed this generation or the
    instances of a READY version died with their workers, else LOADING."""
    if any(r.serving_generation > 0 for r in reports):
        return ModelVersionState(ModelState.READY)
    current = [r for r in reports if r.generation == generation]
    failed = [r for r in current if r.state == ModelState.UNAVAILABLE]
    if current and len(failed) == len(current):
        return ModelVersionState(ModelState.UNAVAILABLE, failed[0].reason)
    if not reports and (previous.state == ModelState.READY or previous.reason == NO_INSTANCES):
        return ModelVersionState(ModelState.UNAVAILABLE, NO_INSTANCES)  # every instance died with its worker
    return ModelVersionState(ModelState.LOADING)


def next_record(
    name: str,
    scanned: ScannedModel,
    labels: dict[str, list[str]],
    previous: ModelRecord | None,
    workers: list[str],
    on_demand: bool,
) -> ModelRecord:
    """The record a load of `name` publishes: its next generation, the scanned config with the
    versions it selects loading, while the previous generation serves until the new one is ready
    (`labels`: its outputs' classification labels). `workers`: only those host it (empty: every worker).

    Raises Triton's load error when the config failed but a version of the previous one is READY:
    that one keeps serving, nothing is published. `previous` is never changed."""
    generation = previous.generation + 1 if previous else 1
    if scanned.config is None:
        if previous is not None and previous.any_version(ModelState.READY):
            raise invalid(f"load failed for model '{name}': {scanned.error}\n")
        failed = {str(v): ModelVersionState(ModelState.UNAVAILABLE, scanned.error) for v in scanned.versions or [1]}
        return ModelRecord(
            name,
            str(scanned.path),
            versions=failed,
            generation=generation,
            reason=scanned.error,
            workers=list(workers),
            on_demand=on_demand,
        )
    config = model_config.to_json(scanned.config)
    hosted = list(scanned.versions)
    # an ensemble has nothing to swap: its new graph serves at once
    serving = previous.active_config if previous and previous.hosted and not is_ensemble(config) else {}
    return ModelRecord(
        name,
        str(scanned.path),
        config,
        _versions(hosted, previous),
        generation,
        hosted,
        serving_config=serving,
        serving_path=(previous.serving_path or previous.path) if previous and serving else "",
        serving_files=(previous.serving_files or previous.files) if previous and serving else [],
        reason="" if hosted else f"no version is available for model '{name}'",
        labels=labels,
        workers=list(workers),
        on_demand=on_demand,
    )


def _versions(hosted: list[int], previous: ModelRecord | None) -> dict[str, ModelVersionState]:
    """The hosted versions LOADING (a READY one stays READY: it serves until the swap), and the
    previous record's other versions UNAVAILABLE, unloaded."""
    old = previous.versions if previous else {}
    versions = {key: ModelVersionState(ModelState.UNAVAILABLE, UNLOADED) for key in old if int(key) not in hosted}
    for version in hosted:
        state = old.get(str(version))
        versions[str(version)] = (
            state if state and state.state == ModelState.READY else ModelVersionState(ModelState.LOADING)
        )
    return versions

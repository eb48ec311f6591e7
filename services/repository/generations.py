"""The record a load publishes: the model's next generation, with the versions it selects
loading while the previous generation serves until the new one is ready (docs/models.md). Pure;
the versions' states come from the state machine (model_states.py)."""

from __future__ import annotations

from services.repository import model_states
from services.repository.scan import ScannedModel
from shared.config import model_config
from shared.config.ensemble_graph import is_ensemble
from shared.errors import invalid
from shared.wire.records import ModelRecord, ModelState


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
        return ModelRecord(
            name,
            str(scanned.path),
            versions=model_states.failed_load(scanned.versions, scanned.error),
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
        model_states.loaded(hosted, previous.versions if previous else {}),
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

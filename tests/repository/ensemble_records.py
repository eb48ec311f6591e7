"""Records of ensembles and their members, for the tests of ensemble states and graphs."""

from __future__ import annotations

from shared.wire.records import ModelRecord, ModelState, ModelVersionState


def io(name: str) -> dict:
    return {"name": name, "data_type": "TYPE_FP32", "dims": [-1]}


def member(name: str, state: ModelState = ModelState.READY, reason: str = "") -> ModelRecord:
    config = {"name": name, "max_batch_size": 8, "input": [io("X")], "output": [io("Y")]}
    hosted = [] if reason else [1]
    return ModelRecord(
        name=name,
        config={} if reason else config,
        versions={"1": ModelVersionState(state)},
        hosted=hosted,
        reason=reason,
    )


def ensemble(name: str, steps: list[str]) -> ModelRecord:
    tensors = ["RAW"] + [f"t{i}" for i in range(len(steps) - 1)] + ["OUT"]
    config = {
        "name": name,
        "platform": "ensemble",
        "max_batch_size": 8,
        "input": [io("RAW")],
        "output": [io("OUT")],
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": m,
                    "model_version": -1,
                    "input_map": {"X": tensors[i]},
                    "output_map": {"Y": tensors[i + 1]},
                }
                for i, m in enumerate(steps)
            ]
        },
    }
    return ModelRecord(name=name, config=config, versions={"1": ModelVersionState(ModelState.LOADING)}, hosted=[1])

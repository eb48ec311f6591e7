"""An ensemble's state follows its composing models' records."""

from __future__ import annotations

from services.repository.ensembles import cycle, dependents, ensemble_state
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


def test_ready_when_every_member_is():
    records = {"a": member("a"), "b": member("b"), "e": ensemble("e", ["a", "b"])}
    assert ensemble_state(records["e"], records, {"a", "b", "e"}) == ModelVersionState(ModelState.READY)


def test_loading_while_a_member_loads_or_is_about_to():
    records = {"a": member("a", ModelState.LOADING), "e": ensemble("e", ["a", "b"])}
    assert ensemble_state(records["e"], records, {"a", "b", "e"}).state == ModelState.LOADING


def test_unavailable_with_the_reason():
    records = {"a": member("a"), "b": member("b", ModelState.UNAVAILABLE), "e": ensemble("e", ["a", "b"])}
    assert ensemble_state(records["e"], records, set(records)) == ModelVersionState(
        ModelState.UNAVAILABLE, "ensemble 'e' depends on 'b' which has no loaded version"
    )
    records["b"] = member("b", reason="bad config")
    assert (
        ensemble_state(records["e"], records, set(records)).reason == "ensemble 'e' depends on 'b' which is not valid"
    )
    del records["b"]
    # not in the repository at all
    assert ensemble_state(records["e"], records, {"a", "e"}).state == ModelState.UNAVAILABLE


def test_nested_cycles_and_dependents():
    records = {"a": member("a"), "outer": ensemble("outer", ["inner", "a"]), "inner": ensemble("inner", ["a"])}
    assert sorted(dependents("a", records)) == ["inner", "outer"]
    assert dependents("inner", records) == ["outer"]
    loop = ensemble("inner", ["outer"])
    assert cycle("inner", records, loop.config) == "circular dependency between ensembles: inner -> outer -> inner"

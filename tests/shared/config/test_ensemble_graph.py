"""Ensemble graphs: Triton's load-time checks (texts included) and pruning of unrequested steps."""

from __future__ import annotations

from services.scheduler.ensembles.step import fit_batching
from shared.config.ensemble_graph import check_members, check_structure, graph_from_config


def step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> dict:
    return {"model_name": model, "model_version": version, "input_map": inputs, "output_map": outputs}


def io(name: str, dtype: str = "TYPE_FP32", dims: list[int] | None = None) -> dict:
    return {"name": name, "data_type": dtype, "dims": dims or [-1]}


def ensemble(steps: list[dict], inputs=("RAW",), outputs=("A", "B"), **extra) -> dict:
    return {
        "name": "e",
        "platform": "ensemble",
        "max_batch_size": 8,
        "input": [io(n) for n in inputs],
        "output": [io(n) for n in outputs],
        "ensemble_scheduling": {"step": steps},
        **extra,
    }


PIPELINE = [
    step("pre", {"X": "RAW"}, {"Y": "p"}),
    step("cls", {"X": "p"}, {"Y": "A"}),
    step("seg", {"X": "p"}, {"Y": "B"}),
]


def member(dtype: str = "TYPE_FP32", dims: list[int] | None = None, mbs: int = 8, inputs=("X",)) -> dict:
    return {"max_batch_size": mbs, "input": [io(n, dtype, dims) for n in inputs], "output": [io("Y", dtype, dims)]}


def test_a_sound_graph_passes():
    config = ensemble(PIPELINE)
    assert check_structure(config) == ""
    assert check_members(config, {"pre": member(), "cls": member(), "seg": member()}) == ""


def test_structure_errors_use_tritons_texts():
    assert check_structure(ensemble([])) == "must specify 'step' for ensemble 'e'"
    assert (
        check_structure(ensemble([step("", {"X": "RAW"}, {"Y": "A"})]))
        == "must specify 'model_name' in step 0 of ensemble 'e'"
    )
    assert (
        check_structure(ensemble(PIPELINE, instance_group=[{"count": 1}]))
        == "instance group should not be specified for ensemble 'e'"
    )
    twice = PIPELINE + [step("again", {"X": "RAW"}, {"Y": "A"})]
    assert (
        check_structure(ensemble(twice))
        == "ensemble tensor 'A' can appear in an output map only once for ensemble 'e' step 3"
    )
    assert (
        check_structure(ensemble(PIPELINE, inputs=("RAW", "UNUSED")))
        == "ensemble input 'UNUSED' for ensemble e' is not used"
    )
    assert (
        check_structure(ensemble(PIPELINE, outputs=("A", "B", "C")))
        == "ensemble output 'C' for ensemble e' is not used"
    )
    unconnected = PIPELINE[:2] + [step("seg", {"X": "nowhere"}, {"Y": "B"})]
    assert check_structure(ensemble(unconnected)) == (
        "output 'B' for ensemble 'e' is not written: at least one of its depending tensors, 'nowhere', is not connected"
    )
    dangling = PIPELINE + [step("extra", {"X": "p"}, {"Y": "dangling"})]
    assert check_structure(ensemble(dangling)) == "ensemble tensor 'dangling' is unused in ensemble 'e'"


def test_a_cycle_never_becomes_ready():
    cyclic = [
        step("m1", {"X": "b"}, {"Y": "a"}),
        step("m2", {"X": "a"}, {"Y": "b"}),
        step("m3", {"X": "RAW"}, {"Y": "A"}),
    ]
    assert check_structure(ensemble(cyclic, outputs=("A",))) == "ensemble tensor 'a' is unused in ensemble 'e'"
    feeding = [
        step("m1", {"X": "RAW", "Z": "b"}, {"Y": "a"}),
        step("m2", {"X": "a"}, {"Y": "b"}),
        step("m3", {"X": "a"}, {"Y": "A"}),
    ]
    assert check_structure(ensemble(feeding, outputs=("A",))).startswith("output 'A' for ensemble 'e' is not written")


def test_member_checks():
    config = ensemble(PIPELINE)
    members = {"pre": member(), "cls": member(), "seg": member("TYPE_STRING")}
    assert check_members(config, members) == (
        "in ensemble e, ensemble tensor p: inconsistent data type: TYPE_FP32 is inferred from model pre "
        "while TYPE_STRING is inferred from model seg"
    )
    members = {"pre": member(dims=[4]), "cls": member(dims=[4]), "seg": member(dims=[5])}
    assert check_members(config, members) == (
        "in ensemble e, ensemble tensor p: inconsistent shape: [-1,4] is inferred from model pre "
        "while [-1,5] is inferred from model seg"
    )
    members = {"pre": member(), "cls": member(mbs=4), "seg": member()}
    assert check_members(config, members) == (
        "ensemble e allows maximum batch size 8, but it contains model cls which only allows maximum batch size to be 4"
    )
    members = {"pre": member(inputs=("X", "W")), "cls": member(), "seg": member()}
    assert check_members(config, members) == "in ensemble e, input W in model pre is not mapped to any ensemble tensors"
    members = {"pre": member(inputs=("Q",)), "cls": member(), "seg": member()}
    assert (
        check_members(config, members)
        == "in ensemble e, ensemble tensor RAW is mapping to non-existing input X in model pre"
    )


def test_pruning_keeps_only_steps_feeding_requested_outputs():
    graph = graph_from_config(ensemble(PIPELINE))
    assert [s.model for s in graph.needed_steps(["A"])] == ["pre", "cls"]
    assert [s.model for s in graph.needed_steps(["B"])] == ["pre", "seg"]
    assert [s.model for s in graph.needed_steps([])] == ["pre", "cls", "seg"]
    assert graph.consumers(graph.needed_steps(["A"])) == {"RAW": 1, "p": 1}
    assert graph.members == ["pre", "cls", "seg"]


def test_batch_dimension_follows_the_receiving_model():
    assert fit_batching((-1,), True, [4], source_batched=False) == [1, 4]  # gains a batch of 1
    assert fit_batching((-1,), False, [1, 4], source_batched=True) == [4]  # loses it
    assert fit_batching((-1, -1), True, [2, 4], source_batched=True) == [2, 4]  # both batch: as is
    assert fit_batching((-1,), False, [2, 4], source_batched=True) == [2, 4]  # a batch of 2 cannot lose it

"""The dataflow of one ensemble request, with the members' answers scripted (no bus)."""

from __future__ import annotations

import asyncio
import time

from services.scheduler.ensembles.ensemble_runner import EnsembleRunner
from shared.wire.messages import InferRequest, InferResponse, TensorRef
from shared.wire.records import ModelRecord, ModelState, ModelVersionState


def io(name: str, dims: list[int] | None = None) -> dict:
    return {"name": name, "data_type": "TYPE_FP32", "dims": dims or [-1]}


def record(name: str, config: dict) -> ModelRecord:
    return ModelRecord(
        name=name, config={"name": name, **config}, versions={"1": ModelVersionState(ModelState.READY)}, hosted=[1]
    )


MEMBER = {"max_batch_size": 8, "input": [io("X")], "output": [io("Y")]}
PIPELINE = {
    "platform": "ensemble",
    "max_batch_size": 8,
    "input": [io("RAW")],
    "output": [io("A"), io("B")],
    "ensemble_scheduling": {
        "step": [
            {"model_name": "pre", "model_version": -1, "input_map": {"X": "RAW"}, "output_map": {"Y": "p"}},
            {"model_name": "cls", "model_version": -1, "input_map": {"X": "p"}, "output_map": {"Y": "A"}},
            {"model_name": "seg", "model_version": -1, "input_map": {"X": "p"}, "output_map": {"Y": "B"}},
        ]
    },
}


class Scripted(EnsembleRunner):
    """Members answer from `answers` (model -> response maker) instead of over the bus."""

    def __init__(self, answers) -> None:
        super().__init__(None, "test")
        self.answers = answers
        self.sent: list[InferRequest] = []
        for revision, (name, config) in enumerate(
            (("pre", MEMBER), ("cls", MEMBER), ("seg", MEMBER), ("pipeline", PIPELINE)), 1
        ):
            self.on_record(name, record(name, config), revision)

    async def call(self, request: InferRequest) -> InferResponse:
        self.sent.append(request)
        await asyncio.sleep(0)
        return self.answers[request.model](request)


def answer(request: InferRequest) -> InferResponse:
    x = request.inputs[0]
    return InferResponse(rid=request.rid, outputs=[TensorRef(name="Y", datatype="FP32", shape=x.shape, data=x.data)])


def run(runner: Scripted, outputs: list[str] | None = None):
    request = InferRequest(
        rid="r1",
        model="pipeline",
        version=1,
        reply="x.r1",
        deadline_ns=1 << 62,
        id="client-id",
        inputs=[TensorRef(name="RAW", datatype="FP32", shape=[1, 1], data=b"\0\0\x80?")],
        outputs=outputs or [],
        parameters={"sequence_id": 7},
        priority=2,
    )
    owned: list[TensorRef] = []
    return asyncio.run(runner._execute(request, owned)), owned


def test_steps_inherit_the_request_and_outputs_are_renamed():
    runner = Scripted({"pre": answer, "cls": answer, "seg": answer})
    outcome, owned = run(runner)
    assert not outcome.error and [o.name for o in outcome.outputs] == ["A", "B"]
    assert [r.model for r in runner.sent] == ["pre", "cls", "seg"]
    assert all(r.id == "client-id" and r.parameters == {"sequence_id": 7} and r.priority == 2 for r in runner.sent)
    assert runner.sent[1].inputs[0].name == "X" and runner.sent[1].inputs[0].data == b"\0\0\x80?"  # the same bytes
    assert len(owned) == 3 and len(outcome.handed) == 2


def test_a_failing_step_fails_the_request_after_the_others_drain():
    def fail(request):
        return InferResponse(rid=request.rid, error="model said no", code="UNAVAILABLE")

    runner = Scripted({"pre": answer, "cls": fail, "seg": answer})
    outcome, owned = run(runner)
    assert (outcome.error, outcome.code) == ("in ensemble 'pipeline', model said no", "UNAVAILABLE")
    assert len(owned) == 2  # pre's and seg's outputs: the runner frees them


def test_an_output_a_member_did_not_produce_is_left_out():
    """core's EnsembleContext: an output a composing model did not produce is a placeholder, and
    `CheckAndSetEnsembleOutput` leaves it out of the response ("Composing models did not output
    tensor ..."): no longer the deadlock error it was before placeholders."""
    runner = Scripted({"pre": answer, "cls": answer, "seg": lambda r: InferResponse(rid=r.rid)})
    outcome, _ = run(runner)
    assert not outcome.error and [o.name for o in outcome.outputs] == ["A"]


def test_unrequested_branches_are_not_run():
    runner = Scripted({"pre": answer, "cls": answer, "seg": answer})
    outcome, _ = run(runner, outputs=["B"])
    assert [r.model for r in runner.sent] == ["pre", "seg"] and [o.name for o in outcome.outputs] == ["B"]


class Counting(Scripted):
    """Counts each member's requests in flight at once; `gate` holds every member's answer."""

    def __init__(self, limit: int) -> None:
        super().__init__({"pre": answer, "cls": answer, "seg": answer})
        config = {
            **PIPELINE,
            "ensemble_scheduling": {**PIPELINE["ensemble_scheduling"], "max_inflight_requests": limit},
        }
        self.on_record("pipeline", record("pipeline", config), 5)
        self.active: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self.gate = asyncio.Event()

    async def call(self, request: InferRequest) -> InferResponse:
        self.active[request.model] = self.active.get(request.model, 0) + 1
        self.most[request.model] = max(self.most.get(request.model, 0), self.active[request.model])
        await self.gate.wait()
        await asyncio.sleep(0.001)
        self.active[request.model] -= 1
        return answer(request)


def pipeline_request(n: int, deadline_ns: int = 1 << 62) -> InferRequest:
    return InferRequest(
        rid=f"r{n}",
        model="pipeline",
        version=1,
        reply=f"x.r{n}",
        deadline_ns=deadline_ns,
        inputs=[TensorRef(name="RAW", datatype="FP32", shape=[1, 1], data=b"\0\0\x80?")],
    )


def test_max_inflight_requests_bounds_each_step_across_the_ensembles_requests():
    """Triton since core PR 482/server PR 8707: not only decoupled ensembles, and one limit per step
    for all the ensemble's requests together."""

    async def go(runner: Counting) -> list:
        calls = [asyncio.create_task(runner._execute(pipeline_request(n), [])) for n in range(6)]
        await asyncio.sleep(0.01)
        runner.gate.set()
        return await asyncio.gather(*calls)

    bounded = Counting(limit=2)
    outcomes = asyncio.run(go(bounded))
    assert all(not o.error and len(o.outputs) == 2 for o in outcomes)
    assert bounded.most == {"pre": 2, "cls": 2, "seg": 2}
    assert bounded.slots.in_use() == 0
    unbounded = Counting(limit=0)
    asyncio.run(go(unbounded))
    assert unbounded.most["pre"] == 6


def test_a_step_waiting_for_a_slot_past_the_deadline_answers_the_timeout():
    async def go(runner: Counting):
        holder = asyncio.create_task(runner._execute(pipeline_request(1), []))
        await asyncio.sleep(0.01)  # its first step holds the only slot, the gate closed
        late = await runner._execute(pipeline_request(2, time.time_ns() + 50_000_000), [])
        runner.gate.set()
        await holder
        return late

    runner = Counting(limit=1)
    late = asyncio.run(go(runner))
    assert (late.error, late.code) == ("in ensemble 'pipeline', Request timeout expired", "UNAVAILABLE")
    assert runner.slots.in_use() == 0

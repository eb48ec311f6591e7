"""services/worker/batches/batch_executor.py against a real nats-server, with the model instance a fake of the
backends' own `Runner` protocol: every request of a batch gets an answer whatever fails, and
the credit goes back to the scheduler with the batch's completion."""

from __future__ import annotations

import time

import msgspec
import nats
import numpy as np
import pytest

from services.worker.backends.runner import Batch, ModelError, Result
from services.worker.batches.batch_executor import BatchExecutor
from services.worker.batches.completions import Completions
from services.worker.batches.decoupled_streams import Cancellations, DecoupledSenders
from services.worker.batches.instance_thread import InstanceThread
from services.worker.batches.instances import Instance, LoadedModel
from services.worker.batches.response_outputs import Outputs
from shared.bus import connection
from shared.bus.tensor_store import TensorStore
from shared.config.model_config import spec_from_json
from shared.errors import Code
from shared.wire import subjects
from shared.wire.messages import ExecBatch, InferRequest, InferResponse, InstanceFree, ResponseBatch, TensorRef, encode
from tests.serving import until

INBOX = "test.gw.reply"
SPEC = spec_from_json(
    {
        "name": "m",
        "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [2]}],
        "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [2]}],
    }
)


class Doubler:
    """A `Runner`: OUT = 2 * IN; a request whose IN starts with -1 is refused by the model, and
    a batch with a request starting with -2 fails as a whole."""

    batches_rows = False
    checks_readiness = False

    def __init__(self) -> None:
        self.seen: list[Batch] = []  # what the model was handed

    def execute(self, batch: Batch) -> list[Result]:
        self.seen.append(batch)
        firsts = [int(w.inputs["IN"].flat[0]) for w in batch.work]
        if -2 in firsts:
            raise RuntimeError("the instance broke")
        return [
            ModelError("negative input", Code.INVALID_ARG) if first == -1 else {"OUT": w.inputs["IN"] * 2}
            for first, w in zip(firsts, batch.work)
        ]

    def is_ready(self) -> bool:
        return True

    def sequence_ended(self, correlation_id: int | str, reason: str) -> None:
        pass

    def close(self) -> None:
        pass


class Bench:
    def __init__(self, nc: nats.NATS) -> None:
        store = TensorStore(nc, "batches-test", transport="bus")
        cancellations, outputs = Cancellations(), Outputs(store)
        self.executor = BatchExecutor(
            "w", nc, store, outputs, cancellations, DecoupledSenders(nc, outputs.streamed, cancellations),
            Completions(nc, "w"),
        )  # fmt: skip
        self.instance = Instance(0, Doubler(), InstanceThread("test-instance"), credits=1)
        self.loaded = LoadedModel(SPEC, 1, 1, [self.instance])
        self.answers: dict[str, InferResponse] = {}
        self.completions: list[InstanceFree] = []
        self.nc = nc

    async def start(self) -> Bench:
        async def on_answer(msg) -> None:  # one answer on its own subject, or a gateway's together
            if msg.subject.endswith(".batch"):
                raws = msgspec.msgpack.decode(msg.data, type=ResponseBatch).responses
            else:
                raws = [msgspec.Raw(msg.data)]
            for raw in raws:
                answer = msgspec.msgpack.decode(raw, type=InferResponse)
                self.answers[answer.rid] = answer

        async def on_free(msg) -> None:
            self.completions.append(msgspec.msgpack.decode(msg.data, type=InstanceFree))

        await self.nc.subscribe(f"{INBOX}.*", cb=on_answer)
        await self.nc.subscribe(subjects.INSTANCE_FREE, cb=on_free)
        await connection.settled(self.nc)
        return self

    def batch(self, *firsts: int, expired: tuple[int, ...] = ()) -> ExecBatch:
        requests = []
        for i, first in enumerate(firsts):
            data = np.array([first, i], np.int32).tobytes()
            deadline = time.time_ns() + (-1 if i in expired else 10**10)
            request = InferRequest(
                f"r{i}", "m", 1, f"{INBOX}.r{i}", deadline, inputs=[TensorRef("IN", "INT32", [2], data)]
            )
            requests.append(msgspec.Raw(encode(request)))
        self.instance.idle.discard(0)  # the credit this batch uses
        return ExecBatch(7, "m", 1, 0, requests, [0] * len(requests), credit=0, generation=1)

    async def run(self, batch: ExecBatch) -> InstanceFree:
        work = self.executor.start(self.loaded, self.instance, batch, holds_credit=True)
        if work is not None:
            await work
        await until(lambda: bool(self.completions), 10, "the batch's completion")
        return self.completions[-1]


@pytest.fixture
async def bench(nats_server):
    nc = await nats.connect(nats_server.url)
    running = await Bench(nc).start()
    yield running
    running.instance.executor.shutdown()
    await nc.close()


def out(answer: InferResponse) -> list[int]:
    [ref] = answer.outputs
    return np.frombuffer(ref.data, np.int32).tolist()


async def test_each_request_is_answered_and_the_credit_goes_back_with_the_completion(bench):
    free = await bench.run(bench.batch(1, 3))
    await until(lambda: len(bench.answers) == 2)
    assert out(bench.answers["r0"]) == [2, 0] and out(bench.answers["r1"]) == [6, 2]
    assert (free.batch_id, free.instance, free.credit, free.generation) == (7, 0, 0, 1)
    assert [(d.rid, d.ok) for d in free.done] == [("r0", True), ("r1", True)]
    assert bench.instance.idle == {0} and bench.executor.holding == set() and bench.instance.executions == 1


async def test_a_request_the_model_refuses_fails_alone(bench):
    free = await bench.run(bench.batch(1, -1))
    await until(lambda: len(bench.answers) == 2)
    assert out(bench.answers["r0"]) == [2, 0]
    assert (bench.answers["r1"].error, bench.answers["r1"].code) == ("negative input", "INVALID_ARG")
    assert [(d.rid, d.ok) for d in free.done] == [("r0", True), ("r1", False)]


async def test_a_failing_batch_answers_every_request_and_still_returns_the_credit(bench):
    free = await bench.run(bench.batch(1, -2))
    await until(lambda: len(bench.answers) == 2)
    assert {a.error for a in bench.answers.values()} == {"the instance broke"}
    assert {a.code for a in bench.answers.values()} == {"INTERNAL"}
    assert free.instance == 0 and bench.instance.idle == {0}


async def test_a_request_past_its_deadline_is_skipped_and_the_rest_run(bench):
    free = await bench.run(bench.batch(1, 2, expired=(0,)))
    await until(lambda: "r1" in bench.answers)
    assert out(bench.answers["r1"]) == [4, 2] and "r0" not in bench.answers  # nobody waits for r0
    assert {d.rid: d.ok for d in free.done}.get("r1") is True and bench.instance.executions == 1


async def test_the_model_sees_each_requests_flags_parameters_and_the_batchs_earliest_deadline(bench):
    """Outside a sequence batcher a request's sequence flags reach the model as the client sent
    them, and its sequence parameters are not the model's own."""
    now = time.time_ns()
    data = np.array([1, 2], np.int32).tobytes()
    sent = [
        InferRequest(
            "r0", "m", 1, f"{INBOX}.r0", now + 10**10, inputs=[TensorRef("IN", "INT32", [2], data)],
            parameters={"sequence_id": 5, "sequence_start": True, "sequence_end": True, "custom": 1},
            sequence_id=5, sequence_start=True, sequence_end=True,
        ),
        InferRequest(
            "r1", "m", 1, f"{INBOX}.r1", now + 10**9, batch_size=2, inputs=[TensorRef("IN", "INT32", [2], data)],
            outputs=["OUT"], sequence_id="abc", sequence_start=True, id="client-1",
        ),
    ]  # fmt: skip
    bench.instance.idle.discard(0)
    batch = ExecBatch(7, "m", 1, 0, [msgspec.Raw(encode(r)) for r in sent], [0, 0], credit=0, generation=1)
    free = await bench.run(batch)
    [seen] = bench.instance.runner.seen
    assert seen.deadline_ns == now + 10**9
    contexts = [w.context for w in seen.work]
    assert [(c.correlation_id, c.flags) for c in contexts] == [(5, 3), ("abc", 1)]
    assert [c.parameters for c in contexts] == [{"custom": 1}, {}]
    assert [c.request_id for c in contexts] == ["", "client-1"]
    assert [(w.outputs, w.batch_size) for w in seen.work] == [(["OUT"], 1), (["OUT"], 2)]
    assert free.batch_size == 3


async def test_a_batch_for_a_model_not_loaded_here_is_failed_and_is_no_credit(bench):
    await bench.executor.fail(bench.batch(1, 2), "model 'm' is not loaded on worker w")
    await until(lambda: len(bench.answers) == 2 and bool(bench.completions))
    assert {a.code for a in bench.answers.values()} == {"UNAVAILABLE"}
    assert bench.completions[-1].instance == -1  # the scheduler must not send here again

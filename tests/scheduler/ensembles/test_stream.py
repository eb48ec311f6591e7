"""One request of a decoupled ensemble, with the members scripted (no bus): iterations, the
in-flight bound, freeing, failures."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec

from services.scheduler.ensembles.ensemble_runner import EnsembleRunner
from shared.errors import unavailable
from shared.wire.messages import InferRequest, InferResponse, TensorRef
from shared.wire.records import ModelRecord, ModelState, ModelVersionState


def io(name: str, dims: list[int] | None = None) -> dict:
    return {"name": name, "data_type": "TYPE_INT32", "dims": dims or [-1]}


def record(name: str, config: dict) -> ModelRecord:
    return ModelRecord(
        name=name, config={"name": name, **config}, versions={"1": ModelVersionState(ModelState.READY)}, hosted=[1]
    )


PRE = {"max_batch_size": 0, "input": [io("X")], "output": [io("Y")]}
GEN = {
    "max_batch_size": 0,
    "input": [io("X")],
    "output": [io("T", [1])],
    "model_transaction_policy": {"decoupled": True},
}
POST = {"max_batch_size": 0, "input": [io("T", [1]), io("P")], "output": [io("Y", [1])]}


def ensemble(limit: int = 0, outputs: tuple[str, ...] = ("OUT",)) -> dict:
    return {
        "platform": "ensemble",
        "max_batch_size": 0,
        "input": [io("IN")],
        "output": [io(name, [1] if name == "OUT" else [-1]) for name in outputs],
        "ensemble_scheduling": {
            "max_inflight_requests": limit,
            "step": [
                {"model_name": "pre", "model_version": -1, "input_map": {"X": "IN"}, "output_map": {"Y": "prompt"}},
                {"model_name": "gen", "model_version": -1, "input_map": {"X": "prompt"}, "output_map": {"T": "token"}},
                {
                    "model_name": "post",
                    "model_version": -1,
                    "input_map": {"T": "token", "P": "prompt"},
                    "output_map": {"Y": "OUT"},
                },
            ],
        },
    }


def int32(value: int) -> bytes:
    return value.to_bytes(4, "little", signed=True)


class Store:
    def __init__(self) -> None:
        self.freed: list[str] = []

    async def release_remote(self, refs: list[TensorRef]) -> None:
        self.freed.extend(ref.shm for ref in refs)

    async def get(self, ref: TensorRef, timeout: float) -> bytes:
        return bytes.fromhex(ref.owner)


class Bus:
    def __init__(self, store: Store) -> None:
        self.sent: list[InferResponse] = []
        self.store = store
        self.freed_when_sent: list[int] = []  # how many segments were freed when each response left

    async def publish(self, subject: str, data: bytes) -> None:
        self.sent.append(msgspec.msgpack.decode(data, type=InferResponse))
        self.freed_when_sent.append(len(self.store.freed))


class StreamingFrom:
    """The runner's dispatcher with its `stream` scripted: a wrapper, not an attribute set on the
    dispatcher itself (the compiled build's `Dispatcher` is a native class, its methods read-only)."""

    def __init__(self, dispatcher: object, stream: Callable[[InferRequest, float], AsyncIterator[InferResponse]]):
        self._dispatcher = dispatcher
        self.stream = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dispatcher, name)


class Scripted(EnsembleRunner):
    """Members answer in-process: every output is a (fake) shared-memory segment, so what is
    freed and what is handed to the client can be counted."""

    def __init__(
        self,
        limit: int = 0,
        tokens: int = 5,
        fail_post_at: int = -1,
        fail_gen_at: int = -1,
        outputs: tuple[str, ...] = ("OUT",),
        hang_at: int = -1,
    ) -> None:
        super().__init__(None, "test")
        self.store = Store()
        self.nc = Bus(self.store)
        self.dispatcher = StreamingFrom(self.dispatcher, self._stream)  # type: ignore[assignment]
        self.segments = (f"seg{i}" for i in itertools.count())
        self.made: list[str] = []
        self.tokens, self.fail_post_at, self.fail_gen_at, self.hang_at = tokens, fail_post_at, fail_gen_at, hang_at
        self.post_running = self.post_most = 0
        self.gen_closed = False
        for revision, (name, config) in enumerate(
            (("pre", PRE), ("gen", GEN), ("post", POST), ("E", ensemble(limit, outputs))), 1
        ):
            self.on_record(name, record(name, config), revision)

    def _ref(self, name: str, value: int) -> TensorRef:
        segment = next(self.segments)
        self.made.append(segment)
        return TensorRef(
            name=name, datatype="INT32", shape=[1], shm=segment, nbytes=4, data=None, owner=int32(value).hex()
        )  # the value rides in `owner`: this store has no bytes

    async def call(self, request: InferRequest) -> InferResponse:
        if request.model == "pre":
            return InferResponse(rid=request.rid, outputs=[self._ref("Y", 100)])
        self.post_running += 1
        self.post_most = max(self.post_most, self.post_running)
        await asyncio.sleep(0.001)  # work: lets other iterations overlap when allowed
        self.post_running -= 1
        token = int.from_bytes(bytes.fromhex(request.inputs[0].owner), "little")
        if token == self.fail_post_at:
            return InferResponse(rid=request.rid, error="post failed", code="INTERNAL")
        return InferResponse(rid=request.rid, outputs=[self._ref("Y", token + 1000)])

    async def _stream(self, request: InferRequest, timeout: float):
        try:
            for i in range(self.tokens):
                await asyncio.sleep(0)
                if i == self.fail_gen_at:
                    yield InferResponse(rid=request.rid, error=f"failed at {i}", more=False)
                    return
                if i == self.hang_at:  # what Dispatcher.stream does at the request's deadline
                    raise unavailable("Request timeout expired")
                yield InferResponse(rid=request.rid, outputs=[self._ref("T", i)], more=True)
            yield InferResponse(rid=request.rid, empty=True)
        finally:
            self.gen_closed = True


def run(runner: Scripted, requests: int = 1) -> list[InferResponse]:
    """`requests` requests of E at once; every response each one sent, in the order sent."""

    def request(n: int) -> InferRequest:
        return InferRequest(
            rid=f"r{n}",
            model="E",
            version=1,
            reply=f"x.r{n}",
            deadline_ns=1 << 62,
            inputs=[TensorRef(name="IN", datatype="INT32", shape=[1], data=int32(1))],
        )

    async def go():
        for n in range(1, requests + 1):
            runner.submit(msgspec.Raw(msgspec.msgpack.encode(request(n))), _Stats())
        await asyncio.gather(*(task for _, task in list(runner.running.values())))

    asyncio.run(go())
    return runner.nc.sent


class _Stats:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def values(sent: list[InferResponse]) -> list[int]:
    return [int.from_bytes(bytes.fromhex(r.outputs[0].owner), "little") for r in sent if r.outputs]


def test_every_iteration_answers_then_the_final_flag():
    runner = Scripted(tokens=5)
    sent = run(runner)
    assert values(sent) == [1000, 1001, 1002, 1003, 1004]
    assert all(r.more and r.outputs[0].name == "OUT" for r in sent[:-1])
    # the generator's bare final flag came before the last postprocess ended: that answer, made
    # with no step in flight, is the final one (Triton's FinishEnsemble), no empty response after
    assert (sent[-1].empty, sent[-1].more, sent[-1].error, len(sent)) == (False, False, "", 5)
    # iterations are freed as they finish, not at the end: by the fourth answer, the tokens of
    # the iterations before it are gone
    assert runner.nc.freed_when_sent[-2] >= 3
    handed = [r.outputs[0].shm for r in sent]
    # every intermediate freed, every answer handed to the gateway (which frees it), nothing twice
    assert sorted(runner.store.freed + handed) == sorted(runner.made)


def test_max_inflight_requests_bounds_each_step():
    unbounded = Scripted(tokens=20)
    run(unbounded)
    assert unbounded.post_most > 1
    bounded = Scripted(limit=1, tokens=20)
    assert values(run(bounded)) == [1000 + i for i in range(20)]
    assert bounded.post_most == 1


def test_max_inflight_requests_is_one_limit_shared_by_the_ensembles_requests():
    """Triton since core PR 482: the bound holds across every request of the ensemble, not per request."""
    unbounded = Scripted(tokens=10)
    run(unbounded, requests=3)
    assert unbounded.post_most > 1
    bounded = Scripted(limit=1, tokens=10)
    sent = run(bounded, requests=3)
    assert bounded.post_most == 1
    assert sorted(values(sent)) == sorted([1000 + i for i in range(10)] * 3)
    assert sum(not r.more for r in sent) == 3  # each request's stream ended
    assert bounded.slots.in_use() == 0


def test_a_failed_request_gives_its_slots_to_the_others():
    runner = Scripted(limit=1, tokens=6, fail_post_at=3)
    sent = run(runner, requests=3)
    assert [r.error for r in sent if not r.more] == ["in ensemble 'E', post failed"] * 3
    assert runner.slots.in_use() == 0


def test_a_failing_iteration_ends_the_stream_with_the_error_after_the_others_drain():
    runner = Scripted(tokens=5, fail_post_at=2)
    sent = run(runner)
    assert sent[-1].error == "in ensemble 'E', post failed" and not sent[-1].more
    assert 1002 not in values(sent)
    handed = [r.outputs[0].shm for r in sent if r.outputs]
    assert sorted(runner.store.freed + handed) == sorted(runner.made)


def test_a_failing_generator_is_closed_and_ends_the_stream():
    runner = Scripted(tokens=5, fail_gen_at=2)
    sent = run(runner)
    assert values(sent) == [1000, 1001]  # the iterations it produced before the error still answer
    assert sent[-1].error == "in ensemble 'E', failed at 2"
    assert runner.gen_closed
    handed = [r.outputs[0].shm for r in sent if r.outputs]
    assert sorted(runner.store.freed + handed) == sorted(runner.made)


def test_an_upstream_output_goes_with_every_iteration_as_a_copy():
    runner = Scripted(tokens=3, outputs=("OUT", "prompt"))
    sent = [r for r in run(runner) if r.outputs]  # the last is the final one (see the first test)
    assert values(sent) == [1000, 1001, 1002]
    prompts = [r.outputs[1] for r in sent]
    assert all(p.name == "prompt" and p.data == int32(100) and not p.shm for p in prompts)
    handed = [r.outputs[0].shm for r in sent]
    assert sorted(runner.store.freed + handed) == sorted(runner.made)  # the preprocess output too


def test_a_generator_past_the_deadline_ends_the_stream():
    runner = Scripted(tokens=5, hang_at=3)
    sent = run(runner)
    assert values(sent) == [1000, 1001, 1002]
    assert (sent[-1].error, sent[-1].code, sent[-1].more) == (
        "in ensemble 'E', Request timeout expired",
        "UNAVAILABLE",
        False,
    )
    handed = [r.outputs[0].shm for r in sent if r.outputs]
    assert sorted(runner.store.freed + handed) == sorted(runner.made)

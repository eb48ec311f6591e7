"""inference/forward.py with a real Dispatcher on a real nats-server and a scheduler
played by a subscription on the model's infer subject that echoes each request's inputs as its
outputs: what goes on the wire, what comes back, and bad parameters refused before sending."""

from __future__ import annotations

import msgspec
import nats
import pytest

from inference.forward import Forwarder
from inference.shm import DISABLED
from inference.types import InputTensor, ParsedRequest, RequestedOutput
from inference.validation import Validated
from shared.bus import connection
from shared.bus.dispatch import Dispatcher
from shared.bus.tensor_store import TensorStore
from shared.config.model_config import spec_from_json
from shared.errors import Code, ShoalError
from shared.wire import subjects
from shared.wire.messages import InferRequest, InferResponse, RequestBatch, encode


def _config(name: str) -> dict:
    return {
        "name": name,
        "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [4]}],
        "output": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [4]}],
    }


SPEC = spec_from_json(_config("echo"))
VALID = Validated(1, "", [], {"IN": True})
DATA = bytes(range(16))


class Echo:
    """The scheduler and worker in one: every request is answered with its inputs, or `error`."""

    def __init__(self, nc: nats.NATS, error: str = "") -> None:
        self.nc, self.error = nc, error
        self.seen: list[InferRequest] = []

    async def on_group(self, msg) -> None:
        for raw in msgspec.msgpack.decode(msg.data, type=RequestBatch).requests:
            request = msgspec.msgpack.decode(raw, type=InferRequest)
            self.seen.append(request)
            answer = (
                InferResponse(request.rid, error=self.error, code=Code.INVALID_ARG)
                if self.error
                else InferResponse(request.rid, "echo", 1, outputs=request.inputs)
            )
            await self.nc.publish(request.reply, encode(answer))


@pytest.fixture
async def bench(nats_server):
    nc = await nats.connect(nats_server.url)
    store = TensorStore(nc, "exec-test", transport="bus")
    dispatcher = Dispatcher(nc, "exec-test", store)
    await dispatcher.start()
    echo = Echo(nc)
    await nc.subscribe(subjects.infer("echo"), cb=echo.on_group)
    await connection.settled(nc)
    yield Forwarder(dispatcher, store, 10.0, shm=None), echo
    await nc.close()


def parsed(parameters: dict | None = None, data: bytes | None = DATA) -> ParsedRequest:
    return ParsedRequest("client-7", [InputTensor("IN", "INT32", [4], data)], [RequestedOutput("IN")], parameters or {})


async def test_a_request_goes_on_the_wire_with_its_parameters_and_its_outputs_come_back(bench):
    executor, echo = bench
    parameters = {"priority": 2, "timeout": 5000, "binary_data_output": True, "custom": "kept", "sequence_id": 9}
    outputs, _, response = await executor.infer(SPEC, 1, parsed(parameters), VALID)
    [sent] = echo.seen
    assert (sent.model, sent.version, sent.id, sent.priority, sent.timeout_us) == ("echo", 1, "client-7", 2, 5000)
    assert sent.parameters == {"custom": "kept", "sequence_id": 9}  # the gateway's own are used up
    assert sent.sequence_id == 9 and not sent.sequence_start
    assert sent.inputs[0].data == DATA  # small: inline
    assert [(o.name, o.datatype, o.shape, bytes(o.data), o.binary) for o in outputs] == [
        ("IN", "INT32", [4], DATA, True)
    ]
    assert response.rid == sent.rid


async def test_the_models_error_reaches_the_caller_with_its_code(bench):
    executor, echo = bench
    echo.error = "bad input"
    with pytest.raises(ShoalError) as err:
        await executor.infer(SPEC, 1, parsed(), VALID)
    assert (err.value.message, err.value.code) == ("bad input", Code.INVALID_ARG)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (
            {"priority": -1},
            "Unable to parse 'priority': attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
        (
            {"timeout": True},
            "Unable to parse 'timeout': attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
        ({"sequence_start": 1}, "Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean"),
    ],
)
async def test_bad_parameters_are_refused_before_anything_is_sent(bench, parameters, message):
    executor, echo = bench
    with pytest.raises(ShoalError) as err:
        await executor.infer(SPEC, 1, parsed(parameters), VALID)
    assert (err.value.message, err.value.code) == (message, Code.INVALID_ARG)
    assert echo.seen == [] and executor.dispatcher.in_flight == 0


async def test_client_shared_memory_is_refused_where_it_is_disabled(bench):
    executor, echo = bench
    with pytest.raises(ShoalError) as err:
        await executor.infer(SPEC, 1, parsed(data=None), VALID)
    assert err.value.message == DISABLED and echo.seen == []


async def test_streamed_responses_come_one_by_one_and_an_error_does_not_end_the_stream(bench):
    executor, _ = bench
    nc = executor.dispatcher.nc
    got: list = []

    async def respond(msg) -> None:
        [raw] = msgspec.msgpack.decode(msg.data, type=RequestBatch).requests
        request = msgspec.msgpack.decode(raw, type=InferRequest)
        await nc.publish(request.reply, encode(InferResponse(request.rid, error="one bad", code="INTERNAL", more=True)))
        await nc.publish(request.reply, encode(InferResponse(request.rid, outputs=request.inputs, more=False)))

    await nc.subscribe(subjects.infer("streamer"), cb=respond)
    await connection.settled(nc)
    spec = spec_from_json(_config("streamer"))
    async for item in executor.stream(spec, 1, parsed(), VALID):
        got.append(item)
    assert isinstance(got[0], ShoalError) and got[0].message == "one bad"
    assert bytes(got[1][0][0].data) == DATA and len(got) == 2

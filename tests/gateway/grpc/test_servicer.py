"""The gRPC servicer's stream plumbing (services/gateway/grpc/servicer.py)."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from services.gateway.grpc.servicer import Inbox


async def test_inbox_wakes_a_waiting_reader_and_keeps_the_order() -> None:
    inbox = Inbox(asyncio.get_running_loop())

    async def write() -> None:
        inbox.put_nowait("a")
        inbox.put_nowait("b")

    reader = asyncio.ensure_future(inbox.get())  # its first step runs before the writer's: it waits
    writer = asyncio.ensure_future(write())
    assert await asyncio.wait_for(reader, 10) == "a"
    assert await asyncio.wait_for(inbox.get(), 10) == "b"
    await writer


@given(st.lists(st.integers(), max_size=50))
def test_inbox_gives_back_what_was_put_in_order(items: list[int]) -> None:
    async def run() -> list[int]:
        inbox = Inbox(asyncio.get_running_loop())
        for item in items:
            inbox.put_nowait(item)
        return [await inbox.get() for _ in items]

    assert asyncio.run(run()) == items


class _Context:
    def invocation_metadata(self) -> list:
        return []


async def test_a_stream_not_read_past_its_limit_cancels_the_request() -> None:
    """Responses a client leaves unread past `stream_unread_bytes` end the request that produces
    them (closing its answers cancels the model's work) with an error the client sees next."""
    from types import SimpleNamespace

    from tritonclient.grpc import service_pb2 as pb

    from services.gateway.grpc.servicer import GrpcService

    service = GrpcService(SimpleNamespace(core=None), stream_unread_bytes=10 * 65_536)  # type: ignore[arg-type]
    produced, closed = [], asyncio.Event()

    async def endless(request, metadata):
        try:
            while True:
                answer = pb.ModelInferResponse(id=str(len(produced)))
                answer.raw_output_contents.append(b"x" * 65_536)
                produced.append(answer.id)
                yield pb.ModelStreamInferResponse(infer_response=answer)
                await asyncio.sleep(0)
        finally:
            closed.set()

    service._stream_answers = endless  # type: ignore[method-assign]

    async def requests():
        yield pb.ModelInferRequest(id="r")

    stream = service.ModelStreamInfer(requests(), _Context())
    first = await stream.__anext__()  # then the client reads nothing
    assert first.infer_response.id == "0"
    await asyncio.wait_for(closed.wait(), 10)
    assert len(produced) <= 13  # the one read, the limit and the one past it held, and one not held
    rest = [message async for message in stream]
    assert "has not read" in rest[-1].error_message
    assert all(not m.error_message for m in rest[:-1])

"""A streamed request's responses as an async generator (`Dispatcher.stream`).

It lives apart from `dispatch.py` because mypyc compiles no async generator and `dispatch.py`
is compiled (shoal/compiled_modules.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from typing import Protocol

from shared.errors import unavailable
from shared.wire.messages import InferRequest, InferResponse

# who wants to know the request a stream opened, in the context that opens it: a BLS stream the
# model cancels keeps reading, so it must name the request to cancel without closing the stream
opened: ContextVar[Callable[[InferRequest], None] | None] = ContextVar("opened", default=None)


class Streams(Protocol):
    """What the generator needs of `dispatch.Dispatcher` (a protocol: no import cycle between the two)."""

    def open_stream(self, request: InferRequest) -> asyncio.Queue[InferResponse]: ...

    async def close_stream(
        self, request: InferRequest, queue: asyncio.Queue[InferResponse], finished: bool
    ) -> None: ...


async def responses(dispatcher: Streams, request: InferRequest, timeout: float) -> AsyncIterator[InferResponse]:
    """Until the response flagged final, or the deadline (Triton's timeout error); closing the
    iterator early cancels the request."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    finished = False
    queue = dispatcher.open_stream(request)
    if (tell := opened.get()) is not None:
        tell(request)
    try:
        while not finished:
            try:
                response = await asyncio.wait_for(queue.get(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise unavailable("Request timeout expired") from None
            finished = not response.more
            yield response
    finally:
        await dispatcher.close_stream(request, queue, finished)

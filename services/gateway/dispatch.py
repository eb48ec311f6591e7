"""The gateway's side of the data path: send a request on the bus, await its response.

Each request gets its own reply subject under this gateway's inbox, so a missing
scheduler shows up at once as NATS "no responders" instead of a silent timeout.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

import msgspec
from nats.aio.client import Client as NATS

from shared import subjects
from shared.errors import ShoalError, unavailable
from shared.messages import InferRequest, InferResponse, encode
from shared.tensors import TensorStore

log = logging.getLogger("shoal.gateway")
_response_decoder = msgspec.msgpack.Decoder(InferResponse)


def _expire(future: asyncio.Future) -> None:
    if not future.done():
        future.set_exception(unavailable("Request timeout expired"))


class Dispatcher:
    def __init__(self, nc: NATS, gateway_id: str, store: TensorStore) -> None:
        self.nc = nc
        self.inbox = subjects.gateway_inbox(gateway_id)
        self.store = store
        self._pending: dict[str, asyncio.Future] = {}
        self._ids = itertools.count()
        self._prefix = gateway_id

    async def start(self) -> None:
        await self.nc.subscribe(f"{self.inbox}.*", cb=self._on_reply)

    def new_rid(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    def reply_subject(self, rid: str) -> str:
        return f"{self.inbox}.{rid}"

    async def infer(self, request: InferRequest, timeout: float) -> InferResponse:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending[request.rid] = future
        # a timer on the future itself: cheaper than asyncio.wait_for's wrapping per request
        timer = loop.call_later(timeout, _expire, future)
        try:
            await self.nc.publish(subjects.infer(request.model), encode(request), reply=request.reply)
            return await future
        finally:
            timer.cancel()
            self._pending.pop(request.rid, None)

    async def _on_reply(self, msg) -> None:
        rid = msg.subject.rsplit(".", 1)[1]
        future = self._pending.get(rid)
        if msg.headers and msg.headers.get("Status") == "503":
            if future is not None and not future.done():
                future.set_exception(
                    ShoalError("no scheduler is serving requests (is the scheduler running?)", "UNAVAILABLE")
                )
            return
        try:
            response = _response_decoder.decode(msg.data)
        except msgspec.DecodeError as exc:
            log.error("undecodable response for %s: %s", rid, exc)
            return
        if future is None or future.done():
            # Late (the client gave up): free the outputs nobody will read.
            await self.store.release_remote(response.outputs)
            return
        future.set_result(response)

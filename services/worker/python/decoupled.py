"""Responses a decoupled python model sends itself, and cancellation of running requests.

A decoupled model answers through `request.get_response_sender().send(...)`, from its
instance thread or any thread it starts, during `execute` or long after. Each response is
published to the request's gateway as soon as it is sent, in the order sent; all but the
final one carry `more=True`. A final flag without a response (`send(flags=FINAL)`) goes
out as an `empty` response, which ends the stream without showing the client anything.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

from nats.aio.client import Client as NATS

from services.worker.python import pb_utils
from shared.errors import ShoalError
from shared.messages import InferRequest, InferResponse, encode
from shared.model_config import ModelSpec

log = logging.getLogger("shoal.worker")

Respond = Callable[[ModelSpec, int, InferRequest, dict], InferResponse]


class Cancellations:
    """Which requests running here their clients gave up on (`request.is_cancelled()`)."""

    def __init__(self) -> None:
        self.running: dict[str, int] = {}  # rid -> deadline (ns)
        self.cancelled: set[str] = set()

    def started(self, request: InferRequest) -> None:
        self.running[request.rid] = request.deadline_ns

    def ended(self, rid: str) -> None:
        self.running.pop(rid, None)
        self.cancelled.discard(rid)

    def cancel(self, rid: str) -> None:
        if rid in self.running:
            self.cancelled.add(rid)

    def is_cancelled(self, request: InferRequest) -> bool:
        """Cancelled by the client, or past its deadline (nobody waits for it any more)."""
        return request.rid in self.cancelled or request.deadline_ns < time.time_ns()

    def expire(self) -> list[str]:
        """Forget requests past their deadline (a decoupled model that never sent its final flag)."""
        now = time.time_ns()
        gone = [rid for rid, deadline in self.running.items() if deadline < now]
        for rid in gone:
            self.ended(rid)
        return gone


class DecoupledSenders:
    def __init__(self, nc: NATS, respond: Respond, cancellations: Cancellations) -> None:
        self.nc = nc
        self.respond = respond
        self.cancellations = cancellations
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.open: dict[str, pb_utils.InferenceResponseSender] = {}

    def sender(self, spec: ModelSpec, version: int, request: InferRequest) -> pb_utils.InferenceResponseSender:
        def send(response: pb_utils.InferenceResponse | None, flags: int) -> None:
            final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (spec, version, request, response, final))

        sender = pb_utils.InferenceResponseSender(send, lambda: self.cancellations.is_cancelled(request))
        self.open[request.rid] = sender
        return sender

    def fail(self, request: InferRequest, message: str, code: str) -> None:
        """`execute` raised: end the request's stream with the error, unless the model already ended it."""
        sender = self.open.get(request.rid)
        if sender is not None and not sender.closed:
            sender.send(
                pb_utils.InferenceResponse(error=pb_utils.TritonError(message, pb_utils.TritonError.code_of(code))),
                pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )

    def expire(self) -> None:
        for rid in self.cancellations.expire():
            self.open.pop(rid, None)

    async def run(self) -> None:
        while True:
            spec, version, request, response, final = await self.queue.get()
            if final:
                self.open.pop(request.rid, None)
                self.cancellations.ended(request.rid)
            try:
                await self.nc.publish(request.reply, encode(self._message(spec, version, request, response, final)))
            except Exception:
                log.exception("could not send a response of request %s", request.rid)

    def _message(
        self,
        spec: ModelSpec,
        version: int,
        request: InferRequest,
        response: pb_utils.InferenceResponse | None,
        final: bool,
    ) -> InferResponse:
        if response is None:
            return InferResponse(rid=request.rid, empty=True)
        if response.has_error():
            error = response.error()
            return InferResponse(rid=request.rid, error=error.message(), code=error.code_name(), more=not final)
        try:
            message = self.respond(spec, version, request, {t.name(): t.as_numpy() for t in response.output_tensors()})
        except ShoalError as exc:
            return InferResponse(rid=request.rid, error=exc.message, code=str(exc.code), more=not final)
        except Exception as exc:  # e.g. an output dtype with no Triton datatype: the client must still hear
            return InferResponse(
                rid=request.rid, error=f"cannot deliver the outputs: {exc}", code="INTERNAL", more=not final
            )
        message.parameters = json.loads(response.parameters())
        message.more = not final
        return message

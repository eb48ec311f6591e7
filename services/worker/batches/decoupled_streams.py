"""Responses a decoupled model sends itself, and cancellation of running requests.

A decoupled model answers through its request's `ResponseStream` (a python model through
`request.get_response_sender().send(...)`), from its instance thread or any thread it starts,
during `execute` or long after. Each response is published to the request's gateway as soon as
it is sent, in the order sent; all but the final one carry `more=True`. A final flag without a
response goes out as an `empty` response, which ends the stream without showing the client anything.

The request's completion tells its scheduler when the first response went out (its
time-to-first-response histogram). A model that sends its first response only after `execute`
returned (from a thread, or an engine's loop: the example LLM) is too late for that; its time
then goes to every scheduler as a `FirstResponse`, which only the scheduler waiting for that
request records (services/scheduler/statistics/late_first.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from nats.aio.client import Client as NATS

from services.worker.backends.runner import ModelError, Piece, Tensors
from shared.config.model_config import ModelSpec
from shared.errors import Code, ShoalError
from shared.wire import subjects
from shared.wire.messages import FirstResponse, InferRequest, InferResponse, encode

log = logging.getLogger("shoal.worker")

Respond = Callable[[ModelSpec, int, InferRequest, Tensors], InferResponse]


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
        gone = [rid for rid, deadline in list(self.running.items()) if deadline < now]  # the hot loop adds
        for rid in gone:
            self.ended(rid)
        return gone


class ResponseStream:
    """One request's `ResponseStream`: pieces go to the event loop in the order sent, each with
    the time of the request's first response when that one came after its completion (else 0)."""

    def __init__(self, put: Callable[[Piece, int], None]) -> None:
        self._put = put
        self._closed = False
        self._lock = threading.Lock()
        self._reported = False  # the completion went: a first response from now on is late
        self.first_ns = 0  # when the model sent its first response (wall clock); 0: none yet

    @property
    def closed(self) -> bool:
        return self._closed

    def report(self) -> int:
        """The first response's time for the request's completion (0: none yet). Under the lock,
        so a first response sent meanwhile is either in it or late, never lost nor counted twice."""
        with self._lock:
            self._reported = True
            return self.first_ns

    def send(self, piece: Piece) -> None:
        with self._lock:
            self._closed = self._closed or piece.final
            late = 0
            if not self.first_ns and (piece.outputs is not None or piece.error is not None):
                self.first_ns = time.time_ns()  # a bare final flag is no response (Triton counts none)
                late = self.first_ns if self._reported else 0
            self._put(piece, late)


class DecoupledSenders:
    def __init__(self, nc: NATS, respond: Respond, cancellations: Cancellations) -> None:
        self.nc = nc
        self.respond = respond
        self.cancellations = cancellations
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[ModelSpec, int, InferRequest, Piece, int]] = asyncio.Queue()
        self.open: dict[str, ResponseStream] = {}

    def stream(self, spec: ModelSpec, version: int, request: InferRequest) -> ResponseStream:
        def put(piece: Piece, late_first_ns: int) -> None:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (spec, version, request, piece, late_first_ns))

        stream = ResponseStream(put)
        self.open[request.rid] = stream
        return stream

    def fail(self, request: InferRequest, message: str, code: Code) -> None:
        """`execute` raised: end the request's stream with the error, unless the model already ended it."""
        stream = self.open.get(request.rid)
        if stream is not None and not stream.closed:
            stream.send(Piece(error=ModelError(message, code), final=True))

    def expire(self) -> None:
        for rid in self.cancellations.expire():
            self.open.pop(rid, None)

    async def run(self) -> None:
        while True:
            spec, version, request, piece, late_first_ns = await self.queue.get()
            if piece.final:
                self.open.pop(request.rid, None)
                self.cancellations.ended(request.rid)
            try:
                await self.nc.publish(request.reply, encode(self._message(spec, version, request, piece)))
                if late_first_ns:
                    late = FirstResponse(request.rid, request.model, request.version, late_first_ns)
                    await self.nc.publish(subjects.FIRST_RESPONSE, encode(late))
            except Exception:
                log.exception("could not send a response of request %s", request.rid)

    def _message(self, spec: ModelSpec, version: int, request: InferRequest, piece: Piece) -> InferResponse:
        more = not piece.final
        if piece.error is not None:
            return InferResponse(rid=request.rid, error=piece.error.message, code=piece.error.code, more=more)
        if piece.outputs is None:
            return InferResponse(rid=request.rid, empty=True)
        try:
            message = self.respond(spec, version, request, piece.outputs)
        except ShoalError as exc:
            return InferResponse(rid=request.rid, error=exc.message, code=str(exc.code), more=more)
        except Exception as exc:  # e.g. an output dtype with no Triton datatype: the client must still hear
            return InferResponse(
                rid=request.rid, error=f"cannot deliver the outputs: {exc}", code="INTERNAL", more=more
            )
        message.parameters = piece.parameters
        message.more = more
        return message

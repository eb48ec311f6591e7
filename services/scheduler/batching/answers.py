"""Answers the scheduler itself gives: failures, and responses released in arrival order
for `preserve_ordering` models."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from services.scheduler.batching.model_queue import ModelQueue
from services.scheduler.statistics.reasons import FailReason
from shared.errors import Code
from shared.wire.messages import InferResponse, RequestHeader, encode

Publish = Callable[[str, bytes], Awaitable[None]]
CANCELLED = "Request was cancelled"  # Triton's core gives the status CANCELLED and no text


class Answers:
    def __init__(self, publish: Publish) -> None:
        self.publish = publish

    async def fail(
        self, queue: ModelQueue, header: RequestHeader, message: str, reason: FailReason = FailReason.OTHER
    ) -> None:
        """Answer a request with a 503 and count it as failed for `reason` (Triton's metric label)."""
        queue.stats.record_request(False, time.time_ns() - header.received_ns, reason)
        response = encode(InferResponse(header.rid, error=message, code=Code.UNAVAILABLE))
        if queue.preserve_ordering:
            await self.finish(queue, header, response)
        else:
            await self.publish(header.reply, response)

    async def finish(self, queue: ModelQueue, header: RequestHeader, response: bytes | None) -> None:
        """Release a response now, or in arrival order for preserve_ordering models (None: the
        request ends with no answer, and later ones no longer wait for it)."""
        if not queue.preserve_ordering:
            if response is not None:
                await self.publish(header.reply, response)
            return
        for reply, due in queue.ordering.finished(header.rid, header.reply, response):
            await self.publish(reply, due)

    async def dropped(self, queue: ModelQueue, header: RequestHeader, reason: FailReason) -> None:
        """It leaves its queue unrun (past its deadline, cancelled): counted. A cancelled one is
        answered CANCELLED, as Triton's core finishes a cancelled request it held: a python model
        that cancelled its BLS stream reads on until that answer (a client that went away is
        forgotten by its gateway, which drops it); one past its deadline is not answered."""
        queue.stats.record_request(False, time.time_ns() - header.received_ns, reason, responded=False)
        answer = None
        if reason is FailReason.CANCELED:
            answer = encode(InferResponse(header.rid, error=CANCELLED, code=Code.CANCELLED))
        await self.finish(queue, header, answer)

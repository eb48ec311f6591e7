"""The answers of one batch, sent as one bus message per gateway.

A batch usually holds requests from few gateways; one `ResponseBatch` per gateway
instead of one message per request cuts the worker's publishes, nats-server's
routing and the gateway's message handling by the batch size.
"""

from __future__ import annotations

import msgspec
from nats.aio.client import Client as NATS

from shared import subjects
from shared.messages import (
    InferRequest,
    InferResponse,
    RequestDone,
    ResponseBatch,
    encode,
)


class Replies:
    def __init__(self, via_scheduler: bool) -> None:
        self.via_scheduler = via_scheduler  # preserve_ordering: the scheduler releases them in order
        self.done: list[RequestDone] = []
        self._by_inbox: dict[str, list[InferResponse]] = {}

    def answered(self) -> set[str]:
        return {d.rid for d in self.done}

    def add(self, request: InferRequest, response: InferResponse) -> None:
        ok = not response.error
        if self.via_scheduler:
            self.done.append(RequestDone(request.rid, ok, encode(response)))
            return
        self._by_inbox.setdefault(subjects.inbox_of(request.reply), []).append(response)
        self.done.append(RequestDone(request.rid, ok))

    def skip(self, request: InferRequest) -> None:
        """A request nobody waits for any more (its deadline passed)."""
        self.done.append(RequestDone(request.rid, False))

    def take(self, inbox: str) -> list[bytes]:
        """The encoded answers for one gateway inbox, which the caller sends itself."""
        return [encode(r) for r in self._by_inbox.pop(inbox, [])]

    async def send(self, nc: NATS, max_payload: int) -> None:
        """One message per gateway, split where it would pass the server's max_payload."""
        budget = max(64 * 1024, max_payload - 64 * 1024)
        for inbox, responses in self._by_inbox.items():
            group: list[bytes] = []
            size = 0
            for response in responses:
                encoded = encode(response)
                if group and size + len(encoded) > budget:
                    await self._publish(nc, inbox, group)
                    group, size = [], 0
                group.append(encoded)
                size += len(encoded)
            await self._publish(nc, inbox, group)
        self._by_inbox.clear()

    @staticmethod
    async def _publish(nc: NATS, inbox: str, group: list[bytes]) -> None:
        await nc.publish(subjects.response_batch(inbox), encode(ResponseBatch([msgspec.Raw(r) for r in group])))

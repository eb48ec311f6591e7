"""The answers of one batch, sent as one bus message per gateway.

A batch usually holds requests from few gateways; one `ResponseBatch` per gateway
instead of one message per request cuts the worker's publishes, nats-server's
routing and the gateway's message handling by the batch size.
"""

from __future__ import annotations

import msgspec

from shared.bus.hot_path import Outgoing
from shared.wire import subjects
from shared.wire.messages import InferRequest, InferResponse, RequestDone, ResponseBatch, encode


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

    def messages(self, max_payload: int) -> list[Outgoing]:
        """One message per gateway, split where it would pass the server's max_payload. The
        answers are handed over: a second call returns none."""
        budget = max(64 * 1024, max_payload - 64 * 1024)
        out: list[Outgoing] = []
        for inbox, responses in self._by_inbox.items():
            subject = subjects.response_batch(inbox)
            group: list[msgspec.Raw] = []
            size = 0
            for response in responses:
                encoded = encode(response)
                if group and size + len(encoded) > budget:
                    out.append(Outgoing(subject, encode(ResponseBatch(group))))
                    group, size = [], 0
                group.append(msgspec.Raw(encoded))
                size += len(encoded)
            out.append(Outgoing(subject, encode(ResponseBatch(group))))
        self._by_inbox.clear()
        return out

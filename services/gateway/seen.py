"""A gateway answers when its view of the models bucket reaches a revision (`RevisionWanted`).

A client's load through a gateway waits for that gateway's view before it answers. A PyTriton
process loads its models straight from the repository, so it asks every gateway instead
(`shared/repository_client.py::gateways_have`), and its `run()` returns once a client of any
gateway can reach what it loaded, as PyTriton's does against Triton.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from inference.models import ModelRegistry
from shared.wire import subjects
from shared.wire.control import RevisionSeen, RevisionWanted
from shared.wire.messages import encode

log = logging.getLogger("shoal.gateway")
_decoder = msgspec.msgpack.Decoder(RevisionWanted)
MAX_WAIT_S = 60.0  # an asker's timeout is its own; this one bounds what a gateway holds for it


class SeenAnswers:
    def __init__(self, nc: NATS, registry: ModelRegistry) -> None:
        self.nc = nc
        self.registry = registry
        self._sub: Subscription | None = None
        self._waits: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(subjects.GATEWAY_SEEN, cb=self._on_wanted)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
        for task in list(self._waits):
            task.cancel()

    async def _on_wanted(self, msg: Msg) -> None:
        try:
            wanted = _decoder.decode(msg.data)
        except msgspec.DecodeError as exc:
            log.warning("unreadable revision request on %s: %s", msg.subject, exc)
            return
        # waiting here would hold every later request of this subscription: a task per request
        task = asyncio.create_task(self._answer(msg.reply, wanted))
        self._waits.add(task)
        task.add_done_callback(self._waits.discard)

    async def _answer(self, reply: str, wanted: RevisionWanted) -> None:
        seen = await self.registry.seen(wanted.revision, min(max(wanted.timeout_s, 0.0), MAX_WAIT_S))
        if reply:
            await self.nc.publish(reply, encode(RevisionSeen(seen)))

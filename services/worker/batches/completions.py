"""Sending a batch's completion: to every scheduler as `InstanceFree`, or, for a batch from a
scheduler co-hosted in a gateway whose requests all came from that gateway, as one `BatchDone`
holding the answers and the completion (docs/design.md, "Co-hosting").

A `BatchDone` is published with a reply subject of this worker's: if the gateway is gone (it
died with its scheduler), NATS answers "no responders" there, and the completion goes to every
scheduler as `InstanceFree` instead, so the instance's credit reaches the replica that takes
the model over (docs/reliability.md).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from shared.bus import hot_path
from shared.bus.hot_path import Outgoing
from shared.bus.local_channel import FrameSink
from shared.wire import subjects
from shared.wire.channel_frames import DONE
from shared.wire.messages import BatchDone, InstanceFree, encode

log = logging.getLogger("shoal.worker")

KEEP_S = 5.0  # a no-responders answer comes within milliseconds; kept this long to be sure


class Completions:
    def __init__(self, nc: NATS, worker_id: str) -> None:
        self.nc = nc
        self._undelivered = subjects.worker_undelivered(worker_id)
        self._ids = itertools.count()  # batch ids are per scheduler: not unique here
        self._sent: OrderedDict[int, tuple[float, InstanceFree]] = OrderedDict()  # id -> completion

    async def start(self) -> None:
        await self.nc.subscribe(f"{self._undelivered}.*", cb=self._on_undelivered)

    async def free(self, free: InstanceFree) -> None:
        await hot_path.publish_all(self.nc, [self.free_message(free)])

    async def done(self, complete_to: str, free: InstanceFree, responses: list[bytes]) -> None:
        await hot_path.publish_all(self.nc, [self.done_message(complete_to, free, responses)])

    @staticmethod
    def free_message(free: InstanceFree) -> Outgoing:
        """The completion for every scheduler."""
        return Outgoing(subjects.INSTANCE_FREE, encode(free))

    def done_message(self, complete_to: str, free: InstanceFree, responses: list[bytes]) -> Outgoing:
        """The answers and the completion in one message to the co-hosted scheduler's gateway
        (the caller publishes it: with the batch's other answers, in one write)."""
        now = time.monotonic()
        while self._sent and next(iter(self._sent.values()))[0] < now - KEEP_S:
            self._sent.popitem(last=False)
        key = next(self._ids)
        self._sent[key] = (now, free)
        payload = encode(BatchDone(free, [msgspec.Raw(r) for r in responses]))
        return Outgoing(complete_to, payload, f"{self._undelivered}.{key}")

    @staticmethod
    def done_on(channel: FrameSink, free: InstanceFree, responses: list[bytes]) -> bool:
        """The `BatchDone` on the local channel its batch came by (docs/design.md §9); False when
        that closed: it goes over NATS then (`done_message`), where a gateway that is gone draws
        "no responders" and the completion reaches every scheduler."""
        return channel.send(DONE, encode(BatchDone(free, [msgspec.Raw(r) for r in responses])))

    async def _on_undelivered(self, msg: Msg) -> None:
        if not (msg.headers and msg.headers.get("Status") == "503"):
            return
        sent = self._sent.pop(int(msg.subject.rsplit(".", 1)[1]), None)
        if sent is not None:
            free = sent[1]
            log.warning("the gateway of batch %d is gone; its completion goes to every scheduler", free.batch_id)
            await self.free(free)

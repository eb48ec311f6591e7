"""Before an unload frees a version's instances, the scheduler replica serving the model finishes
what it queued and runs (docs/models.md, "drains queued and running requests first").

The replica is the one holding the model's lease (`shoal-leases`: model -> scheduler id,
services/scheduler/replicas/leases.py). The drain is addressed to it by name: a request only
the current owner answers went unanswered for the whole unload timeout whenever there was no
owner (an unload just after a load, before the scheduler had claimed the model; a dead owner's
lease not expired yet). No lease: no replica serves the model, so none holds requests for it.
The holder is asked again every `ASK_S`, so a holder that died or handed the model on is
replaced by whoever holds the lease next instead of being waited on to the end.
"""

from __future__ import annotations

import logging
import time

import msgspec
from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue

from shared.wire import subjects
from shared.wire.control import DrainDone, DrainRequest
from shared.wire.messages import encode
from shared.wire.records import Lease

log = logging.getLogger("shoal.repository")

ASK_S = 1.0  # a replica says within this long whether the version is drained yet
ANSWER_S = 2.0  # no answer this long after that: the holder may be gone (a slow one is just asked again)
_done_decoder = msgspec.msgpack.Decoder(DrainDone)


class Drainer:
    """`ModelManager`'s drain (`manager.Drain`): wait until no scheduler holds requests for a version."""

    def __init__(self, nc: NATS, timeout_s: float) -> None:
        self.nc = nc
        self.timeout_s = timeout_s
        self._leases: KeyValue | None = None

    async def __call__(self, model: str, version: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        while (left := deadline - time.monotonic()) > 0:
            holder = await self.holder(model)
            if holder is None:
                return  # no replica serves the model: nothing is queued for it anywhere
            wait = min(left, ASK_S)
            request = DrainRequest(model, version, wait, holder)
            try:
                reply = await self.nc.request(subjects.SCHEDULER_DRAIN, encode(request), timeout=wait + ANSWER_S)
            except NoRespondersError:
                return  # no scheduler at all
            except NatsTimeout:
                log.info(
                    "scheduler %s did not answer the drain of '%s'; asking the lease's holder again", holder, model
                )
                continue
            if drained(reply.data):
                return
        log.warning("'%s' version %d did not drain in %ss; unloading anyway", model, version, self.timeout_s)

    async def holder(self, model: str) -> str | None:
        """The scheduler replica holding the model's lease; None if none does. "" if the bucket
        cannot be read now (then whichever replica owns the model answers)."""
        try:
            if self._leases is None:
                self._leases = await self.nc.jetstream().key_value(subjects.LEASES_BUCKET)
            entry = await self._leases.get(subjects.model_key(model))
        except (BucketNotFoundError, KeyNotFoundError):
            return None  # no scheduler ever started, or none holds this model
        except Exception as exc:  # the bus is away or JetStream has no leader for a moment
            log.debug("lease of '%s' unreadable: %s", model, exc)
            return ""
        if not entry.value:
            return None
        try:
            return msgspec.msgpack.decode(entry.value, type=Lease).holder or None
        except msgspec.DecodeError:  # a replica of another version: whichever owns the model answers
            return ""


def drained(data: bytes) -> bool:
    try:
        return _done_decoder.decode(data).drained
    except msgspec.DecodeError:  # a scheduler from before DrainDone answers only once drained
        return True

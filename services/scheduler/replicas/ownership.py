"""Which models this replica serves, and how one changes hands: the leases (`leases.py`), the
overlap while both replicas take a model's requests, serving what was queued before letting
go, and the live sequences kept across a hand-over (`handover.py`)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from nats.aio.client import Client as NATS

from services.scheduler.replicas import takeover
from services.scheduler.replicas.handover import RESIDUE_MAX_S, SHUTDOWN_RESIDUE_S, HandOver, Queues, Take
from services.scheduler.replicas.leases import TTL_S as LEASE_TTL_S
from services.scheduler.replicas.leases import Leases
from shared.bus import buckets
from shared.wire import subjects
from shared.wire.records import shown_name

log = logging.getLogger("shoal.scheduler")

HANDOVER_S = 2.0  # a model changing replicas is served by both for this long
HANDOVER_DRAIN_S = 10.0  # then the old owner finishes what it queued, for at most this long


class Served(Protocol):
    """What changing hands needs from the service (implemented by `service.SchedulerService`)."""

    async def subscribe(self, model: str) -> None: ...  # take the model's requests
    async def unsubscribe(self, model: str) -> None: ...
    def idle(self, model: str) -> bool: ...  # nothing queued or running for any version
    async def abandon(self, model: str, message: str) -> None: ...  # fail what is left


class Ownership:
    def __init__(self, nc: NATS, me: str, served: Served, queues: Queues, take: Take, alive: str = "") -> None:
        self.nc = nc
        self.me = me
        self.alive = alive  # this process's liveness subject, named in its leases (replicas/takeover.py)
        self.served = served
        self.queues = queues
        self.handover = HandOver(nc, me, queues, self, take)  # live sequences across a hand-over
        self._leases: Leases | None = None

    async def start(self) -> None:
        kv = await buckets.bucket(self.nc, subjects.LEASES_BUCKET, ttl=LEASE_TTL_S)
        self._leases = Leases(
            kv, self.me, self._gain, self._lose, self.served.idle, self.handover.begin, self.alive, self._ping
        )
        await self._leases.rebalance()  # announced and counted before it answers statistics (`replicas`)
        await self.handover.start()
        self.queues.spawn(self.handover.run())
        self.queues.spawn(self._leases.run())

    async def _ping(self, subject: str) -> BaseException | None:
        return await takeover.ping(self.nc, subject)

    async def reconnected(self) -> None:
        """Our connection to NATS is back. While it was away nobody could see our liveness
        subject, so another replica may have taken our models (takeover.py); nats-py has
        subscribed us to their requests again. Renew now: a lease taken fails its
        compare-and-set, and the model is handed over (served here for the overlap, what was
        queued drained) instead of taking requests until the next round."""
        if self._leases is not None:
            await self._leases.reconnected()

    @property
    def leases(self) -> Leases:
        if self._leases is None:
            raise RuntimeError("ownership not started")
        return self._leases

    def replicas(self) -> int:
        """The live scheduler replicas, this one included, as of the last lease round (0: none yet)."""
        return self._leases.replicas if self._leases is not None else 0

    async def replicas_now(self) -> int:
        """The live scheduler replicas as of now: the last round's, and those that joined since."""
        return await self._leases.replicas_now() if self._leases is not None else 0

    def owns(self, model: str) -> bool:
        return self._leases is not None and self._leases.owns(model)

    def wants(self, model: str) -> bool:
        return self._leases is not None and model in self._leases.wanted

    async def want(self, model: str) -> None:
        await self.leases.want(model)

    async def drop(self, model: str) -> None:
        await self.leases.drop(model)

    def owned(self) -> list[str]:
        """The models whose lease this replica holds."""
        return sorted(self.leases.held)

    def handing_over(self) -> dict[str, str]:
        """Sequences of models handed over that this replica still serves: "overlap" or "final"."""
        return {f"{m}/{v}": "final" if final else "overlap" for (m, v), final in self.handover.held.items()}

    async def stop(self) -> None:
        """Another replica takes the models over at once; one with live sequences is served
        here until they end (bounded), as in a hand-over to a joining replica."""
        leases, handover = self.leases, self.handover
        keep = [m for m in leases.held if handover.worth_keeping(m)] if leases.replicas > 1 else []
        leases.closing = True
        for model in keep:
            await handover.begin(model)
        await leases.release_all()
        if keep:
            log.info("serving the live sequences of %s until they end (at most %g s)", keep, SHUTDOWN_RESIDUE_S)
            await asyncio.gather(*(self._hand_over(model, SHUTDOWN_RESIDUE_S) for model in keep))
        await handover.wait(SHUTDOWN_RESIDUE_S)  # hand-overs to a joining replica under way

    async def _gain(self, model: str) -> None:
        await self.served.subscribe(model)
        await self.handover.regain(model)
        await self.nc.publish(subjects.RESYNC, b"")  # workers announce their idle credits again

    async def _lose(self, model: str) -> None:
        """Stop taking requests for `model` once its new owner had time to subscribe, serve what
        is already queued, and only then give up what is left."""
        self.queues.spawn(self._hand_over(model))

    async def _hand_over(self, model: str, keep_s: float = RESIDUE_MAX_S) -> None:
        await asyncio.sleep(HANDOVER_S)
        if self.owns(model):  # claimed back meanwhile
            await self.handover.cancel(model)
            return
        await self.served.unsubscribe(model)
        await self.handover.serve(model, keep_s)  # live sequences stay here until they end
        if self.owns(model):  # it came back while we served them: ours again, nothing to give up
            return
        await self.handover.lost(model, f"scheduler {self.me} lost model '{model}'")
        deadline = time.monotonic() + HANDOVER_DRAIN_S
        while not self.served.idle(model) and time.monotonic() < deadline and not self.owns(model):
            await asyncio.sleep(0.05)
        # claimed back while it drained (a lease lost to a NATS node's death comes back in
        # seconds): its queue and its credits are ours to serve again. Abandoning them then
        # dropped the credits of a model this replica serves, and its requests waited for their
        # deadlines (issue 37: 30 s in test_losing_the_schedulers_nats_node_...)
        if not self.owns(model):
            await self.served.abandon(model, f"scheduler {self.me} no longer serves model '{shown_name(model)}'; retry")

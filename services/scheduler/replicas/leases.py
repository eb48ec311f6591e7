"""Which scheduler replica serves which model: per-model leases in a JetStream KV bucket.

A lease is a key (the model) holding the owner's id (a `Lease`), created atomically (`create` fails if
it exists) and kept alive by compare-and-set updates every `refresh_s`. The bucket's TTL
expires the leases of a replica that died, and another replica claims them on its next
round; or sooner, when the lease names a liveness subject that NATS finds no one behind in two
rounds (`takeover.py`: a process that died, not one that is slow or reconnecting). Replicas holding fewer
models try first, so models spread across replicas; a replica proven dead stops counting among
them at once. A replica that cannot write its leases keeps them while its last write lives, and
for good when it is the only replica (`_alone`): nobody else could serve its models
(docs/reliability.md, a full store).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from services.scheduler.replicas import takeover
from shared.bus import buckets
from shared.wire import subjects
from shared.wire.messages import encode
from shared.wire.records import Lease

log = logging.getLogger("shoal.scheduler")

REFRESH_S = 1.0
TTL_S = 4.0  # a dead owner's models move after this long

Hook = Callable[[str], Awaitable[None]]
Probe = Callable[[str], Awaitable[BaseException | None]]  # ask a liveness subject (`takeover.ping`)
PRESENCE = "replica."  # keys of the live replicas (model keys never contain '.')
# replicas_now() lists the presence keys at most this often: a replica that joins has not yet claimed
# anything so soon after its presence appears, so a count this old still finds whoever holds a model
LISTING_REUSE_S = 0.1


class Leases:
    def __init__(
        self,
        kv: KeyValue,
        owner: str,
        on_gain: Hook,
        on_loss: Hook,
        idle: Callable[[str], bool] = lambda model: True,
        on_release: Hook | None = None,
        alive: str = "",
        probe: Probe | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kv = kv
        self.owner = owner
        self._lease = encode(Lease(owner, alive))  # the value of every lease it holds
        self._presence = alive.encode()  # the value of its presence key: gone with it when proven dead
        self.probe = probe  # None: a lease held by another waits for its TTL
        self._gone: dict[str, bool] = {}  # liveness subject -> found dead, this round (one ping per holder)
        self.clock = clock  # for the verdicts only: a test passes its own
        self._verdicts = takeover.Verdicts(clock())  # connected just before we were made
        self.on_gain = on_gain
        self.on_loss = on_loss
        self.idle = idle  # a model with nothing queued or running can move without failing anything
        self.on_release = on_release  # before a lease is given up on purpose (the new owner cannot have it yet)
        self.replicas = 0  # live replicas, this one included, as of the last round (0: not counted yet)
        self._present: frozenset[str] = frozenset()  # the presence keys the last round counted
        self._listed: tuple[float, frozenset[str]] = (-LISTING_REUSE_S, frozenset())  # replicas_now's last look
        self.closing = False  # shutting down: claim nothing any more
        self._presence_revision = 0
        self.fair = 1 << 30  # models this replica may hold: set from the live replicas each round
        self.wanted: set[str] = set()  # models some worker hosts
        self.held: dict[str, int] = {}  # model -> revision of our lease
        self.renewed: dict[str, float] = {}  # model -> when our lease was last written (time.monotonic())
        self._lock = asyncio.Lock()
        self._unwritable = False  # said once: the leases take no writes and this replica serves on

    def owns(self, model: str) -> bool:
        return model in self.held

    async def want(self, model: str) -> None:
        self.wanted.add(model)
        await self.claim(model)

    async def drop(self, model: str) -> None:
        """No longer served by anyone (unloaded): give the lease back."""
        self.wanted.discard(model)
        async with self._lock:
            if self.held.pop(model, None) is not None:
                await self._delete(model)
                await self.on_loss(model)

    def _claimable(self, model: str) -> bool:
        return model not in self.held and model in self.wanted and not self.closing

    async def claim(self, model: str) -> None:
        """Claim `model` if nobody holds it, or if its holder is certainly dead."""
        async with self._lock:
            if not self._claimable(model):
                return
            try:
                self.held[model] = await self.kv.create(subjects.model_key(model), self._lease)
                self.renewed[model] = time.monotonic()
                elsewhere = False
            except Exception:  # held by another replica (or the bus is away): try next round
                elsewhere = True
        if elsewhere and not await self._take_over(model):
            return
        log.info("scheduler %s serves model '%s'", self.owner, model)
        await self.on_gain(model)

    async def _take_over(self, model: str) -> bool:
        """The lease is held: take it at once if its holder is certainly dead (`takeover.py`).
        The holder is asked outside the lock: a slow answer must not hold up the renewals."""
        key = subjects.model_key(model)
        try:
            entry = await self.kv.get(key)
        except Exception:  # expired meanwhile (created next round) or the bus is away
            return False
        lease = takeover.suspect(entry.value, self._lease)
        if lease is None or not await self._dead(lease.alive):
            return False
        async with self._lock:
            if not self._claimable(model):
                return False
            try:  # on the revision read: fails if the holder renewed after all or another claimant won
                self.held[model] = await self.kv.update(key, self._lease, last=entry.revision)
            except Exception as exc:
                log.debug("take-over of '%s' lost: %s", model, exc)
                return False
            self.renewed[model] = time.monotonic()
        log.warning(
            "scheduler %s took model '%s' over at once: its holder is gone (%s)", self.owner, model, lease.alive
        )
        return True

    async def _dead_replicas(self, keys: list[str]) -> int:
        """How many other replicas' presence keys name a liveness subject proven dead; those keys
        are deleted. Counted for the TTL, a dead replica kept the fair share low: the survivors,
        at their share, left its models to it (or handed theirs to it) until then. Only the key it
        wrote goes: a successor with its id writes another value."""
        if self.probe is None:
            return 0
        mine = f"{PRESENCE}{self.owner}"
        entries = await asyncio.gather(*(self._get(k) for k in keys if k.startswith(PRESENCE) and k != mine))
        present = [(entry, entry.value.decode()) for entry in entries if entry is not None and entry.value]
        await self._judge({subject for _, subject in present})
        dead = 0
        for entry, subject in present:
            if self._gone.get(subject):
                try:
                    await self.kv.delete(entry.key, last=entry.revision)
                    dead += 1
                except Exception as exc:  # rewritten meanwhile, or the bus is away: the TTL rule
                    log.debug("presence %s: %s", entry.key, exc)
        return dead

    async def _get(self, key: str) -> KeyValue.Entry | None:
        try:
            return await self.kv.get(key)
        except Exception:  # expired meanwhile, or the bus is away
            return None

    async def _judge(self, alive: set[str]) -> None:
        """Ask the holders not asked yet this round, all at once: one after another, k silent
        holders made the round 0.5·k s longer, and from k = 6 longer than the TTL of our own
        leases. Together they take one ping timeout (`takeover.PING_S`) at most."""
        await asyncio.gather(*(self._dead(subject) for subject in alive - set(self._gone)))

    async def _judge_holders(self, models: list[str]) -> None:
        """Ask the holders of the models about to be claimed together (`_judge`)."""
        if self.probe is None or not models:
            return
        entries = await asyncio.gather(*(self._get(subjects.model_key(m)) for m in models))
        leases = [takeover.suspect(e.value, self._lease) for e in entries if e is not None]
        await self._judge({lease.alive for lease in leases if lease is not None})

    async def _dead(self, subject: str) -> bool:
        if self.probe is None:
            return False
        if subject not in self._gone:
            outcome = await self.probe(subject)
            self._gone[subject] = self._verdicts.judge(subject, outcome, self.clock())
        return self._gone[subject]

    async def reconnected(self) -> None:
        """Our connection to NATS is back: judge nobody dead for a while (`takeover.Verdicts`),
        and renew at once (`Ownership.reconnected`)."""
        self._verdicts.reconnected(self.clock())
        self._gone.clear()
        await self.refresh()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            await self.round()

    async def round(self) -> None:
        self._gone.clear()  # holders are asked again each round
        await self.refresh()
        await self.rebalance()
        # replicas with fewer models claim first: the models spread across replicas
        await asyncio.sleep(0.05 * len(self.held))
        if len(self.held) < self.fair:
            await self._judge_holders(sorted(self.wanted - set(self.held)))
        for model in sorted(self.wanted - set(self.held)):
            if len(self.held) >= self.fair:  # the others take the rest
                break
            await self.claim(model)

    async def rebalance(self) -> None:
        """Announce this replica; hand idle models above a fair share to the others."""
        if self.closing:  # no longer counted as a replica, so nothing is handed to it
            return
        try:
            self._presence_revision = await self.kv.put(f"{PRESENCE}{self.owner}", self._presence)
            keys = await buckets.keys(self.kv)
        except Exception:  # the bus may be away
            return
        if not keys:  # the bus went away after the put
            return
        self._present = frozenset(k for k in keys if k.startswith(PRESENCE))
        self.replicas = replicas = max(1, len(self._present) - await self._dead_replicas(keys))
        self.fair = fair = -(-len(self.wanted) // replicas)
        for model in sorted(self.held)[: max(0, len(self.held) - fair)]:
            if self.idle(model):
                log.info("scheduler %s hands model '%s' to another replica", self.owner, model)
                if self.on_release is not None:
                    await self.on_release(model)
                async with self._lock:
                    gone = self.held.pop(model, None) is not None
                    if gone:
                        await self._delete(model)
                if gone:  # not lost to a refresh meanwhile, which hands it over itself
                    await self.on_loss(model)

    async def replicas_now(self) -> int:
        """The last round's count, plus the replicas whose presence appeared since. A statistics
        reply says how many replicas answer, and the gateway stops waiting at that many: counted
        only by rounds, a replica that started after this one's last round (a second ago at
        most, longer on a busy host) went unheard, and its models' statistics read as zeros.
        0 until the first round (the gateway then waits a moment for more replies)."""
        if self.replicas == 0:
            return 0
        now = time.monotonic()
        if now - self._listed[0] >= LISTING_REUSE_S:  # many callers at once (gateways' scrapes): one listing
            try:
                keys = await buckets.list_keys(self.kv)
            except Exception:  # the bus may be away: the last round's count
                return self.replicas
            self._listed = (now, frozenset(k for k in keys if k.startswith(PRESENCE)))
        return self.replicas + len(self._listed[1] - self._present)

    async def refresh(self) -> None:
        for model, revision in list(self.held.items()):
            try:
                async with self._lock:
                    if model in self.held:
                        self.held[model] = await self.kv.update(subjects.model_key(model), self._lease, last=revision)
                        self.renewed[model] = time.monotonic()
                        self._unwritable = False
            except Exception as exc:  # expired and taken, or the bus is away too long
                if await self._keep(model):
                    continue
                # a reconnect's refresh runs beside the round's: only the one that gives the model
                # up hands it over (both did: two hand-overs, the lost sequences' residue twice)
                async with self._lock:
                    gone = self.held.pop(model, None) is not None
                if gone:
                    log.warning("scheduler %s lost model '%s': %s", self.owner, model, exc)
                    await self.on_loss(model)

    async def _keep(self, model: str) -> bool:
        """A refresh failed: whether the lease is still ours. After the loss of the NATS node that
        led the leases stream, no write succeeds until another node leads it (seconds, more on a
        loaded machine); the lease expires meanwhile, or its last refresh was applied but its
        answer lost. Giving the model up then left it unserved for seconds though no other
        replica could have taken it (test_losing_one_of_three_nats_nodes_under_load)."""
        key = subjects.model_key(model)
        try:
            async with self._lock:
                if model not in self.held:
                    return False
                try:
                    entry = await self.kv.get(key)
                except KeyNotFoundError:  # expired: nobody took it, so claim it back at once
                    self.held[model] = await self.kv.create(key, self._lease)
                else:
                    if entry.value != self._lease:  # taken by another replica
                        return False
                    self.held[model] = await self.kv.update(key, self._lease, last=entry.revision)
                self.renewed[model] = time.monotonic()
                self._unwritable = False
                return True
        except Exception as exc:  # the stream has no leader yet: ours while our last write lives
            log.debug("lease of '%s' not renewable now: %s", model, exc)
            if time.monotonic() - self.renewed.get(model, 0.0) < TTL_S:
                return True
            return self._alone(exc)

    def _alone(self, exc: Exception) -> bool:
        """Past the TTL with no write taken: keep the model when this is the only replica. No other
        replica can serve it, and one that starts now cannot claim it while the bucket takes no
        writes either; giving it up left the model unserved until nats-server restarted. That is a
        stream nats-server stopped writing (a full store: it writes to such a stream again only
        after a restart), while reads still answer."""
        if self.replicas != 1:
            return False
        if not self._unwritable:
            log.error(
                "scheduler %s cannot renew its model leases (%s): serving on as the only scheduler replica; "
                "nats-server's /healthz says why (a full JetStream store needs space and nats-server restarted)",
                self.owner,
                type(exc).__name__,
            )
            self._unwritable = True
        return True

    async def release_all(self) -> None:
        """On shutdown: let another replica take over at once instead of after the TTL."""
        for model in list(self.held):
            await self._delete(model)
        self.held.clear()
        try:
            await self.kv.delete(f"{PRESENCE}{self.owner}")
        except Exception:
            pass

    async def _delete(self, model: str) -> None:
        try:
            await self.kv.delete(subjects.model_key(model))
        except Exception as exc:
            log.debug("release lease of '%s': %s", model, exc)

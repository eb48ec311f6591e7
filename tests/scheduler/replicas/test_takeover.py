"""Taking a dead holder's lease at once (services/scheduler/replicas/takeover.py): what counts as
proof of death (only NATS "no responders"), which leases may be judged, and the compare-and-set
that lets one claimant win, against a real nats-server's KV."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import nats
import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from services.scheduler.replicas import takeover
from services.scheduler.replicas.leases import PRESENCE, REFRESH_S, TTL_S, Leases
from services.scheduler.replicas.takeover import CONFIRM_S, SETTLE_S, STALE_S, Verdicts
from shared.bus import buckets
from shared.wire import subjects
from shared.wire.messages import encode
from shared.wire.records import Lease


def test_only_no_responders_proves_a_holder_dead():
    assert takeover.dead(NoRespondersError())
    for outcome in (None, NatsTimeoutError(), asyncio.TimeoutError(), ConnectionError(), RuntimeError()):
        assert not takeover.dead(outcome), outcome


@given(st.text(min_size=1), st.text(), st.text())
def test_a_lease_is_judged_by_the_subject_it_names(holder, alive, mine):
    value, own = encode(Lease(holder, alive)), encode(Lease("me", mine))
    expected = None if value == own or not alive else Lease(holder, alive)
    assert takeover.suspect(value, own) == expected


@given(st.binary())
def test_any_stored_value_is_judged_without_error(value):
    named = takeover.suspect(value, b"mine")
    assert named is None or (isinstance(named, Lease) and named.alive)
    assert takeover.suspect(value, value) is None  # our own


def test_a_lease_from_an_older_version_names_no_subject():
    old = msgspec.msgpack.encode({"holder": "b"})  # before `alive` existed
    assert takeover.suspect(old, encode(Lease("a", "x"))) is None


NR, ANSWER = NoRespondersError(), None


def test_no_responders_once_proves_nothing():
    verdicts = Verdicts(0.0)
    assert not verdicts.judge("a", NR, SETTLE_S)
    assert verdicts.judge("a", NR, SETTLE_S + CONFIRM_S)  # seen again a round later: dead


def test_no_responders_twice_too_close_proves_nothing_yet():
    verdicts = Verdicts(0.0)
    assert not verdicts.judge("a", NR, SETTLE_S)
    assert not verdicts.judge("a", NR, SETTLE_S + CONFIRM_S / 2)
    assert verdicts.judge("a", NR, SETTLE_S + CONFIRM_S)


def test_an_answer_between_starts_the_count_again():
    """A holder that was reconnecting for a few milliseconds answers the next round."""
    verdicts = Verdicts(0.0)
    assert not verdicts.judge("a", NR, SETTLE_S)
    assert not verdicts.judge("a", ANSWER, SETTLE_S + 1)
    assert not verdicts.judge("a", NR, SETTLE_S + 2)
    assert verdicts.judge("a", NR, SETTLE_S + 2 + CONFIRM_S)


def test_nobody_is_judged_dead_soon_after_our_own_reconnect():
    verdicts = Verdicts(0.0)
    assert not verdicts.judge("a", NR, 0.1)
    assert not verdicts.judge("a", NR, SETTLE_S - 0.1)  # twice, a second apart: still settling
    assert verdicts.judge("a", NR, SETTLE_S)
    verdicts.reconnected(10.0)  # what was seen before proves nothing now
    assert not verdicts.judge("a", NR, 10.0 + SETTLE_S)
    assert verdicts.judge("a", NR, 10.0 + SETTLE_S + CONFIRM_S)


def test_a_stale_no_responders_is_not_reused():
    verdicts = Verdicts(0.0)
    assert not verdicts.judge("a", NR, SETTLE_S)
    assert not verdicts.judge("a", NR, SETTLE_S + STALE_S + 0.1)  # nothing seen between: a first time
    assert verdicts.judge("a", NR, SETTLE_S + STALE_S + 0.1 + CONFIRM_S)


@given(st.lists(st.tuples(st.floats(0, 2 * STALE_S), st.booleans()), max_size=12), st.floats(0, 3 * SETTLE_S))
def test_dead_only_on_no_responders_again_a_round_later_once_settled(pings, connected):
    """Whatever the pings: dead means "no responders" now, and at least `CONFIRM_S` ago with
    nothing else between nor a gap over `STALE_S`, and we connected `SETTLE_S` ago."""
    verdicts, now = Verdicts(connected), connected
    since: float | None = None  # the first "no responders" of the unbroken run
    last = now
    for step, silent in pings:
        now += step
        if not silent:
            since = None
        elif since is None or now - last > STALE_S:
            since = now
        last = now
        expected = since is not None and now - since >= CONFIRM_S and now - connected >= SETTLE_S
        assert verdicts.judge("a", NR if silent else ANSWER, now) == expected


class Clock:
    """The verdicts' clock (`Leases.clock`), moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def settled(self) -> Clock:
        self.now += SETTLE_S
        return self

    def next_round(self, *replicas: Leases) -> None:
        self.now += CONFIRM_S
        for leases in replicas:
            leases._gone.clear()  # what each round does first (`Leases.round`)


@dataclass
class Replica:
    nc: nats.NATS
    leases: Leases
    lost: list[str]
    liveness: Subscription

    def __iter__(self) -> Iterator[Any]:
        return iter((self.nc, self.leases, self.lost))


async def _replica(url: str, owner: str, clock: Clock, answer: bool = True, ping_s: float = 0.3) -> Replica:
    """A replica whose liveness subject is subscribed (answered, or left unanswered: a slow one)."""
    nc = await nats.connect(url)
    alive = subjects.scheduler_alive(owner, "1")

    async def respond(msg) -> None:
        if answer:
            await msg.respond(b"")

    subscription = await nc.subscribe(alive, cb=respond)
    kv = await buckets.bucket(nc, subjects.LEASES_BUCKET, ttl=TTL_S)
    lost: list[str] = []

    async def gained(model: str) -> None:
        pass

    async def gone(model: str) -> None:
        lost.append(model)

    async def probe(subject: str) -> BaseException | None:
        return await takeover.ping(nc, subject, timeout=ping_s)

    leases = Leases(kv, owner, gained, gone, alive=alive, probe=probe, clock=clock)
    return Replica(nc, leases, lost, subscription)


async def test_a_dead_holders_lease_is_taken_a_round_later(nats_server):
    clock = Clock()
    nc_a, a, _ = await _replica(nats_server.url, "a", clock)
    nc_b, b, _ = await _replica(nats_server.url, "b", clock)
    clock.settled()
    await a.want("dead")
    await nc_a.close()  # SIGKILL's effect on the bus: no subscription of a left, its lease still there
    await b.want("dead")
    assert not b.owns("dead")  # "no responders" once
    clock.next_round(b)
    await b.claim("dead")
    assert b.owns("dead")
    assert (await b.kv.get(subjects.model_key("dead"))).value == encode(Lease("b", subjects.scheduler_alive("b", "1")))
    await b.refresh()  # renewed as its own from there
    assert b.owns("dead")
    await nc_b.close()


@pytest.mark.parametrize("answer", [True, False], ids=["answering", "slow"])
async def test_a_live_holders_lease_is_not_taken(nats_server, answer):
    model = f"live-{answer}"
    clock = Clock()
    nc_a, a, lost_a = await _replica(nats_server.url, "a", clock, answer)
    nc_b, b, _ = await _replica(nats_server.url, "b", clock)
    clock.settled()
    await a.want(model)
    for _ in range(3):  # rounds of both: no flapping
        await b.want(model)
        await a.refresh()
        await b.refresh()
        clock.next_round(b)
    assert a.owns(model) and not b.owns(model) and lost_a == []
    await nc_a.close()
    await nc_b.close()


async def test_a_holder_away_for_a_moment_keeps_its_lease(nats_server):
    """Reconnecting, a holder has no subscription for a few milliseconds: one "no responders",
    then an answer the next round, proves nothing."""
    clock = Clock()
    away = await _replica(nats_server.url, "a", clock)
    nc_a, a, lost_a = away
    nc_b, b, _ = await _replica(nats_server.url, "b", clock)
    clock.settled()
    await a.want("blip")
    await away.liveness.unsubscribe()  # what its connection's loss does to its liveness subject
    await nc_a.flush()
    await b.want("blip")

    async def respond(msg) -> None:
        await msg.respond(b"")

    away.liveness = await nc_a.subscribe(subjects.scheduler_alive("a", "1"), cb=respond)
    await nc_a.flush()
    clock.next_round(b)
    await b.claim("blip")
    await a.refresh()
    assert a.owns("blip") and not b.owns("blip") and lost_a == []
    await nc_a.close()
    await nc_b.close()


async def test_a_holder_that_was_away_notices_its_lease_was_taken(nats_server):
    """Away for two rounds, a holder's lease is taken, and its next renewal (a compare-and-set
    on its own revision) fails and gives the model up."""
    clock = Clock()
    away = await _replica(nats_server.url, "a", clock)
    nc_a, a, lost_a = away
    nc_b, b, _ = await _replica(nats_server.url, "b", clock)
    clock.settled()
    await a.want("away")
    await away.liveness.unsubscribe()
    await nc_a.flush()
    await b.want("away")
    clock.next_round(b)
    await b.claim("away")
    assert b.owns("away")
    await a.refresh()
    assert not a.owns("away") and lost_a == ["away"]
    await nc_a.close()
    await nc_b.close()


async def test_a_replica_just_connected_judges_nobody_dead(nats_server):
    """Connected to a NATS node whose routes are not all up yet, a replica finds no responders
    for holders that live on other nodes: for `SETTLE_S` after its (re)connect it takes nothing."""
    clock = Clock()
    nc_a, a, _ = await _replica(nats_server.url, "a", clock)
    await a.want("settling")
    await a.rebalance()
    await nc_a.close()
    nc_b, b, _ = await _replica(nats_server.url, "b", clock)  # connected now
    await b.want("settling")
    clock.next_round(b)  # "no responders" twice, a round apart, both while settling
    await b.claim("settling")
    await b.rebalance()
    assert not b.owns("settling") and b.replicas == 2
    await b.reconnected()  # as after its own reconnect: settling again
    clock.next_round(b)
    clock.next_round(b)
    await b.claim("settling")
    assert not b.owns("settling")
    clock.next_round(b)
    await b.claim("settling")
    assert b.owns("settling")
    await nc_b.close()


async def test_two_claimants_of_a_dead_holders_lease_one_wins(nats_server):
    clock = Clock()
    nc_a, a, _ = await _replica(nats_server.url, "a", clock)
    claimants = [await _replica(nats_server.url, name, clock) for name in ("b", "c")]
    clock.settled()
    await a.want("contended")
    await nc_a.close()
    await asyncio.gather(*(leases.want("contended") for _, leases, _ in claimants))
    clock.next_round(*(leases for _, leases, _ in claimants))
    await asyncio.gather(*(leases.claim("contended") for _, leases, _ in claimants))
    winners = [leases.owner for _, leases, _ in claimants if leases.owns("contended")]
    assert len(winners) == 1, winners
    value = (await claimants[0].leases.kv.get(subjects.model_key("contended"))).value
    assert msgspec.msgpack.decode(value, type=Lease).holder == winners[0]
    for nc, _, _ in claimants:
        await nc.close()


async def test_a_lease_naming_no_subject_waits_for_its_ttl(nats_server):
    clock = Clock()
    nc_b, b, _ = await _replica(nats_server.url, "b", clock)
    clock.settled()
    await b.kv.create(subjects.model_key("older"), encode(Lease("a")))  # an older version's replica
    await b.want("older")
    clock.next_round(b)
    await b.claim("older")
    assert not b.owns("older")
    await nc_b.close()


async def test_a_dead_replica_stops_counting_a_round_later(nats_server):
    """Counted until its presence key expired, a dead replica kept the fair share low: the
    survivor, at its share, left the dead one's models unclaimed for the TTL."""
    clock = Clock()
    nc_a, a, _ = await _replica(nats_server.url, "a", clock)
    nc_b, b, _ = await _replica(nats_server.url, "b", clock)
    clock.settled()
    await a.rebalance()
    await b.rebalance()
    assert b.replicas == 2  # both alive: both counted, nothing removed
    clock.next_round(b)
    await b.rebalance()
    assert b.replicas == 2 and "replica.a" in await buckets.keys(b.kv)
    await nc_a.close()
    clock.next_round(b)
    await b.rebalance()
    assert b.replicas == 2  # "no responders" once
    clock.next_round(b)
    await b.rebalance()
    assert b.replicas == 1 and "replica.a" not in await buckets.keys(b.kv)
    await nc_b.close()


async def test_silent_holders_do_not_delay_our_renewals(nats_server):
    """Holders alive but answering no ping (each times out) are asked together: one after
    another, eight of them made a round 4 s longer, past the TTL of this replica's own leases."""
    clock = Clock()
    silent = [await _replica(nats_server.url, f"s{i}", clock, answer=False) for i in range(8)]
    for i, (_, leases, _) in enumerate(silent):
        await leases.want(f"busy{i}")
        await leases.kv.put(f"{PRESENCE}{leases.owner}", leases._presence)  # present, as a live replica is
    nc, me, lost = await _replica(nats_server.url, "me", clock, ping_s=takeover.PING_S)
    clock.settled()
    await me.want("mine")
    me.wanted |= {f"busy{i}" for i in range(len(silent))}
    started = time.monotonic()
    await me.round()
    took = time.monotonic() - started
    assert took + REFRESH_S < TTL_S - 1, f"a round took {took:.2f} s"  # renewed next round within the TTL
    assert me.owns("mine") and lost == []
    assert {f"{PRESENCE}{leases.owner}" for _, leases, _ in silent} <= set(await buckets.keys(me.kv))  # not judged
    for replica in [*silent]:
        await replica.nc.close()
    await nc.close()

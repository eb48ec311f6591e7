"""Taking a dead holder's lease at once (services/scheduler/replicas/takeover.py): what counts as
proof of death (only NATS "no responders"), which leases may be judged, and the compare-and-set
that lets one claimant win, against a real nats-server's KV."""

from __future__ import annotations

import asyncio
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
from services.scheduler.replicas.leases import TTL_S, Leases
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


@dataclass
class Replica:
    nc: nats.NATS
    leases: Leases
    lost: list[str]
    liveness: Subscription

    def __iter__(self) -> Iterator[Any]:
        return iter((self.nc, self.leases, self.lost))


async def _replica(url: str, owner: str, answer: bool = True) -> Replica:
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
        return await takeover.ping(nc, subject, timeout=0.3)

    return Replica(nc, Leases(kv, owner, gained, gone, alive=alive, probe=probe), lost, subscription)


async def test_a_dead_holders_lease_is_taken_at_once(nats_server):
    nc_a, a, _ = await _replica(nats_server.url, "a")
    nc_b, b, _ = await _replica(nats_server.url, "b")
    await a.want("dead")
    await nc_a.close()  # SIGKILL's effect on the bus: no subscription of a left, its lease still there
    await b.want("dead")
    assert b.owns("dead")
    assert (await b.kv.get(subjects.model_key("dead"))).value == encode(Lease("b", subjects.scheduler_alive("b", "1")))
    await b.refresh()  # renewed as its own from there
    assert b.owns("dead")
    await nc_b.close()


@pytest.mark.parametrize("answer", [True, False], ids=["answering", "slow"])
async def test_a_live_holders_lease_is_not_taken(nats_server, answer):
    model = f"live-{answer}"
    nc_a, a, lost_a = await _replica(nats_server.url, "a", answer)
    nc_b, b, _ = await _replica(nats_server.url, "b")
    await a.want(model)
    for _ in range(3):  # rounds of both: no flapping
        await b.want(model)
        await a.refresh()
        await b.refresh()
        b._gone.clear()
    assert a.owns(model) and not b.owns(model) and lost_a == []
    await nc_a.close()
    await nc_b.close()


async def test_a_holder_that_was_away_notices_its_lease_was_taken(nats_server):
    """Alive but reconnecting, a holder has no subscription either: its lease is taken, and its
    next renewal (a compare-and-set on its own revision) fails and gives the model up."""
    away = await _replica(nats_server.url, "a")
    nc_a, a, lost_a = away
    nc_b, b, _ = await _replica(nats_server.url, "b")
    await a.want("away")
    await away.liveness.unsubscribe()  # what its connection's loss does to its liveness subject
    await nc_a.flush()
    await b.want("away")
    assert b.owns("away")
    await a.refresh()
    assert not a.owns("away") and lost_a == ["away"]
    await nc_a.close()
    await nc_b.close()


async def test_two_claimants_of_a_dead_holders_lease_one_wins(nats_server):
    nc_a, a, _ = await _replica(nats_server.url, "a")
    claimants = [await _replica(nats_server.url, name) for name in ("b", "c")]
    await a.want("contended")
    await nc_a.close()
    await asyncio.gather(*(leases.want("contended") for _, leases, _ in claimants))
    winners = [leases.owner for _, leases, _ in claimants if leases.owns("contended")]
    assert len(winners) == 1, winners
    value = (await claimants[0].leases.kv.get(subjects.model_key("contended"))).value
    assert msgspec.msgpack.decode(value, type=Lease).holder == winners[0]
    for nc, _, _ in claimants:
        await nc.close()


async def test_a_lease_naming_no_subject_waits_for_its_ttl(nats_server):
    nc_b, b, _ = await _replica(nats_server.url, "b")
    await b.kv.create(subjects.model_key("older"), encode(Lease("a")))  # an older version's replica
    await b.want("older")
    assert not b.owns("older")
    await nc_b.close()


async def test_a_dead_replica_stops_counting_at_once(nats_server):
    """Counted until its presence key expired, a dead replica kept the fair share low: the
    survivor, at its share, left the dead one's models unclaimed for the TTL."""
    nc_a, a, _ = await _replica(nats_server.url, "a")
    nc_b, b, _ = await _replica(nats_server.url, "b")
    await a.rebalance()
    await b.rebalance()
    assert b.replicas == 2  # both alive: both counted, nothing removed
    await b.rebalance()
    assert b.replicas == 2 and "replica.a" in await buckets.keys(b.kv)
    await nc_a.close()
    b._gone.clear()  # a new round: the holders are asked again
    await b.rebalance()
    assert b.replicas == 1 and "replica.a" not in await buckets.keys(b.kv)
    await nc_b.close()

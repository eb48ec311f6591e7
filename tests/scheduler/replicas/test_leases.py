"""Per-model leases against a real nats-server's KV: a refresh that fails keeps the lease when it
is still this replica's (expired with nobody else claiming it, as while the leases stream has no
leader after a NATS node loss), and gives it up when another replica holds it."""

from __future__ import annotations

import asyncio

import nats

from services.scheduler.replicas.leases import TTL_S, Leases
from shared.bus import buckets
from shared.wire import subjects
from shared.wire.messages import encode
from shared.wire.records import Lease


async def _leases(url: str, owner: str) -> tuple[nats.NATS, Leases, list[str]]:
    nc = await nats.connect(url)
    kv = await buckets.bucket(nc, subjects.LEASES_BUCKET, ttl=TTL_S)
    lost: list[str] = []

    async def gained(model: str) -> None:
        pass

    async def gone(model: str) -> None:
        lost.append(model)

    return nc, Leases(kv, owner, gained, gone), lost


async def test_a_lease_that_expired_unclaimed_is_kept(nats_server):
    nc, leases, lost = await _leases(nats_server.url, "a")
    await leases.want("expired")
    assert leases.owns("expired")
    await leases.kv.delete(subjects.model_key("expired"))  # what its expiry leaves: no key
    await leases.refresh()
    assert leases.owns("expired") and lost == []
    assert (await leases.kv.get(subjects.model_key("expired"))).value == encode(Lease("a"))
    await leases.refresh()  # and renewed as usual from there
    assert leases.owns("expired")
    await nc.close()


async def test_a_lease_another_replica_took_is_given_up(nats_server):
    nc, leases, lost = await _leases(nats_server.url, "a")
    await leases.want("taken")
    await leases.kv.delete(subjects.model_key("taken"))
    await leases.kv.create(subjects.model_key("taken"), encode(Lease("b")))  # replica b claimed it after the expiry
    await leases.refresh()
    assert not leases.owns("taken") and lost == ["taken"]
    await nc.close()


async def _seal(nc: nats.NATS) -> None:
    """The leases stream takes no more writes while reads still answer: what nats-server does to
    a stream whose store failed (a full disk) until it restarts; sealing is its way on purpose."""
    js = nc.jetstream()
    config = (await js.stream_info(f"KV_{subjects.LEASES_BUCKET}")).config
    config.sealed = True
    await js.update_stream(config)


async def test_the_only_replica_keeps_its_models_when_the_leases_take_no_writes(nats_server):
    nc, leases, lost = await _leases(nats_server.url, "a")
    await leases.rebalance()  # counted: the only replica
    assert leases.replicas == 1
    await leases.want("m")
    await _seal(nc)
    leases.renewed["m"] -= TTL_S  # its last write is past the TTL
    await leases.refresh()
    assert leases.owns("m") and lost == []
    await _unseal(nc)


async def test_one_of_several_replicas_gives_its_models_up_when_the_leases_take_no_writes(nats_server):
    nc, leases, lost = await _leases(nats_server.url, "a")
    await leases.kv.put("replica.b", b"")  # another replica is alive (its presence key)
    await leases.rebalance()
    assert leases.replicas == 2
    await leases.want("m")
    await _seal(nc)
    leases.renewed["m"] -= TTL_S
    await leases.refresh()
    assert not leases.owns("m") and lost == ["m"]  # the TTL rule: the other may hold it by now
    await _unseal(nc)


async def _unseal(nc: nats.NATS) -> None:
    """A sealed stream stays sealed: the next test gets a new bucket."""
    await nc.jetstream().delete_stream(f"KV_{subjects.LEASES_BUCKET}")
    await nc.close()


async def test_a_lease_lost_under_two_concurrent_refreshes_is_handed_over_once(nats_server):
    """A reconnect renews (`Ownership.reconnected`) beside the round's own refresh: both fail on
    the old revision, and only the one that gives the model up may hand it over (twice: two
    hand-overs, the lost sequences' residue published twice)."""
    nc, leases, lost = await _leases(nats_server.url, "a")
    await leases.want("twice")
    await leases.kv.put(subjects.model_key("twice"), encode(Lease("b")))  # taken while we were away
    await asyncio.gather(leases.refresh(), leases.refresh())
    assert not leases.owns("twice") and lost == ["twice"]
    await nc.close()


async def test_a_replica_that_joined_since_the_last_round_is_counted_at_once(nats_server):
    """A statistics reply declares how many replicas answer (the gateway waits for that many):
    a replica that started after this one's round must be counted before the next round."""
    nc, a, _ = await _leases(nats_server.url, "a")
    await a.rebalance()
    assert a.replicas == 1
    other, b, _ = await _leases(nats_server.url, "b")
    await b.rebalance()  # b's presence key: b now claims and serves
    assert a.replicas == 1  # a's next round is a second away
    assert await a.replicas_now() == 2
    await a.rebalance()
    assert a.replicas == 2 and await a.replicas_now() == 2
    await other.close()
    await nc.close()

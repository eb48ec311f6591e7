"""services/scheduler/acknowledgements.py on a real nats-server: the first group from an inbox
is acknowledged at once, later ones together in one message per inbox, each with the header
that names the scheduler's liveness subject."""

from __future__ import annotations

import msgspec
import nats

from services.scheduler.acknowledgements import Acknowledgements
from shared.bus import connection
from shared.wire import subjects
from shared.wire.messages import HeldGroups
from tests.serving import until


async def test_groups_are_acknowledged_once_at_first_then_together(nats_server):
    nc = await nats.connect(nats_server.url)
    got: list[tuple[str, str, list[str]]] = []

    async def collect(msg) -> None:
        groups = msgspec.msgpack.decode(msg.data, type=HeldGroups).groups
        got.append((msg.subject, msg.headers[subjects.HELD_BY_HEADER], groups))

    await nc.subscribe("inbox.*.held", cb=collect)
    await connection.settled(nc)
    acks = Acknowledgements(nc.publish, "alive.s1", delay_s=0.2)
    await acks.took("inbox.a.g1")
    await until(lambda: len(got) == 1)
    assert got[0] == ("inbox.a.held", "alive.s1", ["g1"])  # a new inbox: at once
    for group in ("g2", "g3", "g4"):
        await acks.took(f"inbox.a.{group}")
    await acks.took("inbox.b.g1")  # another dispatcher: its own first acknowledgement
    await until(lambda: len(got) == 2)
    assert got[1] == ("inbox.b.held", "alive.s1", ["g1"])
    await until(lambda: len(got) == 3)
    assert got[2] == ("inbox.a.held", "alive.s1", ["g2", "g3", "g4"])  # one message for the three
    await acks.stop()
    await nc.close()


async def test_stop_sends_what_is_due_at_once(nats_server):
    nc = await nats.connect(nats_server.url)
    got: list[list[str]] = []

    async def collect(msg) -> None:
        got.append(msgspec.msgpack.decode(msg.data, type=HeldGroups).groups)

    await nc.subscribe("inbox.c.held", cb=collect)
    await connection.settled(nc)
    acks = Acknowledgements(nc.publish, "alive.s2", delay_s=30)
    await acks.took("inbox.c.g1")
    await acks.took("inbox.c.g2")
    await acks.stop()  # long before the 30 s delay
    await until(lambda: len(got) == 2)
    assert got == [["g1"], ["g2"]]
    await nc.close()

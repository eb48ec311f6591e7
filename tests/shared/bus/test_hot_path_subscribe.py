"""bus.subscribe (callbacks run as messages are read) against a real nats-server."""

from __future__ import annotations

import asyncio

from shared.bus import connection, hot_path
from tests.serving import until


async def test_messages_run_in_order_one_at_a_time_and_errors_do_not_stop_the_subscription(nats_server):
    nc = await connection.connect(nats_server.url, "test-inline")
    seen: list[int] = []
    running = 0
    overlap = False

    async def on_msg(msg) -> None:
        nonlocal running, overlap
        running += 1
        overlap = overlap or running > 1
        n = int(msg.data)
        if n % 7 == 0:
            await asyncio.sleep(0.01)  # a callback that waits: later messages queue behind it
        running -= 1
        seen.append(n)
        if n % 5 == 0:
            raise RuntimeError("a bad message")

    try:
        sub = await hot_path.subscribe(nc, "inline.test", on_msg)
        for n in range(200):
            await nc.publish("inline.test", str(n).encode())
        await until(lambda: len(seen) == 200)
        assert seen == list(range(200)) and not overlap
        assert sub.pending_bytes == 0  # nats-py's slow-consumer accounting stays balanced
        await nc.publish("inline.test", b"200")  # the connection and the subscription still work
        await until(lambda: seen[-1] == 200)
        assert nc.is_connected
    finally:
        await nc.close()


async def test_queue_group_and_unsubscribe(nats_server):
    nc = await connection.connect(nats_server.url, "test-inline-queue")
    got: list[bytes] = []

    async def on_msg(msg) -> None:
        got.append(msg.data)

    try:
        sub = await hot_path.subscribe(nc, "inline.q", on_msg, queue="workers")
        await nc.publish("inline.q", b"a")
        await until(lambda: got == [b"a"])
        await sub.unsubscribe()
        await connection.settled(nc)
        await nc.publish("inline.q", b"b")
        await connection.settled(nc)
        await asyncio.sleep(0)
        assert got == [b"a"]
    finally:
        await nc.close()


async def test_a_settled_subscription_gets_another_connections_next_publish(nats_server):
    """`bus.settled`, not `nc.flush()`: nats-py's PING can overtake a SUB still queued for its
    flusher, and a publish right after the PONG then finds nobody (it answers "no responders")."""
    for attempt in range(100):
        subscriber, publisher = (
            await connection.connect(nats_server.url, "test-sub"),
            await connection.connect(nats_server.url, "test-pub"),
        )
        try:

            async def answer(msg) -> None:
                await msg.respond(msg.data)

            await subscriber.subscribe(f"settled.{attempt}", cb=answer)
            await connection.settled(subscriber)
            reply = await publisher.request(f"settled.{attempt}", b"x", timeout=30)  # no responders raises
            assert reply.data == b"x"
        finally:
            await subscriber.close()
            await publisher.close()

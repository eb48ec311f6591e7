"""bus.publish_now / publish_all (the worker's answers and completion in one write, reply subjects
included) and hot_path.subscribe_now (a plain-function callback) against a real nats-server."""

from __future__ import annotations

import asyncio
import contextvars

import nats
import pytest

from shared.bus import connection, hot_path
from shared.process.natsserver import NatsServer
from tests.serving import until

_tag: contextvars.ContextVar[str] = contextvars.ContextVar("tag", default="")


@pytest.fixture(scope="module")
def nats_url():
    with NatsServer(max_payload=4096) as server:
        yield server.url


async def test_publishes_keep_their_order_and_bytes_with_nats_py_publishes_between(nats_url):
    receiver = await connection.connect(nats_url, "test-publish-rx")
    sender = await connection.connect(nats_url, "test-publish-tx")
    got: list[tuple[str, bytes, str]] = []

    async def on_msg(msg) -> None:
        got.append((msg.subject, msg.data, msg.reply))

    try:
        await hot_path.subscribe(receiver, "pub.>", on_msg)
        await connection.settled(receiver)
        sent: list[tuple[str, bytes, str]] = []
        for n in range(50):
            batch = [
                hot_path.Outgoing("pub.a", b"PUB x 3\r\n\r\n" + bytes([n])),
                hot_path.Outgoing("pub.b", b"", f"re.{n}"),
            ]
            if n % 2:
                await sender.publish("pub.plain", b"%d" % n)  # queued for nats-py's flusher
                sent.append(("pub.plain", b"%d" % n, ""))
                assert not hot_path.publish_now(sender, batch)  # something queued before: it must wait behind
                await hot_path.publish_all(sender, batch)
            else:
                await sender.flush()  # nothing queued: written at once
                assert hot_path.publish_now(sender, batch)
            sent += [tuple(m) for m in batch]
        await until(lambda: len(got) == len(sent))
        assert got == sent
        assert sender.stats["out_msgs"] == len(sent)
    finally:
        await receiver.close()
        await sender.close()


async def test_a_message_over_max_payload_or_with_a_bad_subject_sends_none_of_its_batch(nats_url):
    nc = await connection.connect(nats_url, "test-publish-big")
    try:
        await connection.settled(nc)
        for publish in (hot_path.publish_now, hot_path.publish_all):
            with pytest.raises(nats.errors.MaxPayloadError):
                result = publish(nc, [hot_path.Outgoing("pub.small", b"x"), hot_path.Outgoing("pub.big", b"x" * 5000)])
                if asyncio.iscoroutine(result):
                    await result
        for bad in (hot_path.Outgoing("pub x", b""), hot_path.Outgoing("pub.x", b"", "re\r\nPUB y 0")):
            with pytest.raises(nats.errors.BadSubjectError):
                hot_path.publish_now(nc, [hot_path.Outgoing("pub.fine", b"x"), bad])
        assert nc._pending_data_size == 0 and nc.stats["out_msgs"] == 0
    finally:
        await nc.close()


async def test_subscribe_now_runs_a_plain_callback_in_order_in_a_context_of_its_own(nats_url):
    nc = await connection.connect(nats_url, "test-subscribe-now")
    seen: list[int] = []
    tags: list[str] = []

    def on_msg(msg) -> None:
        tags.append(_tag.get())
        _tag.set(msg.data.decode())  # must not leak into the next message's callback
        seen.append(int(msg.data))
        if int(msg.data) % 5 == 0:
            raise RuntimeError("a bad message")

    try:
        sub = await hot_path.subscribe_now(nc, "now.test", on_msg)
        for n in range(100):
            await nc.publish("now.test", str(n).encode())
        await until(lambda: len(seen) == 100)
        assert seen == list(range(100)) and set(tags) == {""}
        assert sub.pending_bytes == 0
        await sub.unsubscribe()
        assert nc.is_connected
    finally:
        await nc.close()

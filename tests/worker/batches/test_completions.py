"""services/worker/batches/completions.py against a real nats-server: a `BatchDone` reaches the gateway
that waits for it, and one whose gateway is gone becomes an `InstanceFree` to every scheduler
(the credit is not lost with the gateway)."""

from __future__ import annotations

import asyncio

import msgspec
import nats

from services.worker.batches.completions import Completions
from shared.bus import connection
from shared.wire import subjects
from shared.wire.messages import BatchDone, InstanceFree


def _free(batch_id: int) -> InstanceFree:
    return InstanceFree("w1", "m", 1, 0, subjects.worker_exec("w1"), batch_id=batch_id)


async def _collect(nc: nats.NATS, subject: str) -> asyncio.Queue:
    got: asyncio.Queue = asyncio.Queue()

    async def on(msg) -> None:
        await got.put(msg.data)

    await nc.subscribe(subject, cb=on)
    await connection.settled(nc)
    return got


async def test_a_live_gateway_gets_the_answers_and_the_completion_in_one_message(nats_server):
    worker, gateway = await nats.connect(nats_server.url), await nats.connect(nats_server.url)
    completions = Completions(worker, "w1")
    await completions.start()
    inbox = subjects.gateway_inbox("g1")
    done = await _collect(gateway, subjects.batch_done(inbox))
    await completions.done(subjects.batch_done(inbox), _free(7), [b"\x81\xa3rid\xa2r1"])
    message = msgspec.msgpack.decode(await asyncio.wait_for(done.get(), 30), type=BatchDone)
    assert message.free.batch_id == 7 and [bytes(r) for r in message.responses] == [b"\x81\xa3rid\xa2r1"]
    await worker.close()
    await gateway.close()


async def test_a_gone_gateway_s_completion_goes_to_every_scheduler(nats_server):
    worker, schedulers = await nats.connect(nats_server.url), await nats.connect(nats_server.url)
    completions = Completions(worker, "w1")
    await completions.start()
    free = await _collect(schedulers, subjects.INSTANCE_FREE)
    await completions.done(subjects.batch_done(subjects.gateway_inbox("gone")), _free(9), [])
    resent = msgspec.msgpack.decode(await asyncio.wait_for(free.get(), 30), type=InstanceFree)
    assert resent.batch_id == 9 and resent.worker == "w1"
    await worker.close()
    await schedulers.close()

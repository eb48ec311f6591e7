"""services/worker/python/processes/child_reports.py against a real nats-server: a python model's process
that dies is judged by its own reports (loading or not), and a bucket that cannot be read for a
moment (the server restarting) is read again instead of being taken for "no reports" (the flake
where a deliberate crash right after a quick load was taken for a death while loading)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from services.worker.python.processes.child_reports import ChildReports
from shared.bus import buckets, connection
from shared.process.natsserver import NatsServer
from shared.wire import subjects
from shared.wire.messages import encode
from shared.wire.records import InstanceRecord, ModelRecord, ModelState

PARENT = "w1"
CHILD = f"{PARENT}-py-crasher"
RECORD = ModelRecord(name="crasher", generation=3, hosted=[1])


@pytest.fixture
def server():
    with NatsServer() as running:
        yield running


async def _bucket(url: str):
    nc = await connection.connect(url, "test-child-reports")
    return nc, await buckets.bucket(nc, "shoal-instances-test")


async def _report(kv, state: ModelState, incarnation: str = "a1b2c3") -> None:
    key = subjects.instance_key(f"{CHILD}-{incarnation}", RECORD.name, 1)
    await kv.put(key, encode(InstanceRecord(f"{CHILD}-{incarnation}", RECORD.name, 1, RECORD.generation, state)))


async def _parent_report(kv) -> InstanceRecord:
    entry = await kv.get(subjects.instance_key(PARENT, RECORD.name, 1))
    return msgspec.msgpack.decode(entry.value, type=InstanceRecord)


async def test_a_quick_death_after_ready_is_a_crash_and_its_reports_go(server):
    nc, kv = await _bucket(server.url)
    try:
        await _report(kv, ModelState.READY)
        assert await ChildReports(kv, PARENT).crashed(RECORD, CHILD, -11, lived_s=1.0) is False
        assert await buckets.list_keys(kv) == []  # the dead incarnation's report is gone
    finally:
        await nc.close()


async def test_a_quick_death_without_a_word_or_while_loading_fails_the_load(server):
    nc, kv = await _bucket(server.url)
    try:
        reports = ChildReports(kv, PARENT)
        assert await reports.crashed(RECORD, CHILD, -11, lived_s=1.0) is True
        failed = await _parent_report(kv)
        assert (failed.state, failed.reason) == (
            ModelState.UNAVAILABLE,
            "the process of python model 'crasher' exited with code -11 while loading it",
        )
        await reports.forget(RECORD.name, [1])
        await _report(kv, ModelState.LOADING)
        assert await reports.crashed(RECORD, CHILD, -6, lived_s=30.0) is True  # said LOADING: died loading
    finally:
        await nc.close()


async def test_reports_unreadable_for_a_moment_are_read_again(server):
    nc, kv = await _bucket(server.url)
    try:
        await _report(kv, ModelState.READY)
        server.kill()  # the bus goes away just as the crash is judged
        judged = asyncio.create_task(ChildReports(kv, PARENT).crashed(RECORD, CHILD, -11, lived_s=1.0))
        await asyncio.to_thread(server.start)
        assert await asyncio.wait_for(judged, 30) is False  # read READY once back: a crash, restarted
    finally:
        await nc.close()

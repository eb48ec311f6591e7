"""inference/replica_statistics.py against a real nats-server: every replica's reply decoded as a
`SchedulerStatistics` and merged; a malformed one is logged and skipped, never failing the call."""

from __future__ import annotations

import asyncio
import logging

import pytest
from nats.aio.msg import Msg

from inference.replica_statistics import model_entries, scheduler_stats
from shared.bus import connection
from shared.errors import Code, ShoalError
from shared.wire import subjects
from shared.wire.messages import encode
from shared.wire.statistics import Duration, InferenceStats, ModelStatistics, SchedulerStatistics, VersionStatistics


def _reply(pending: int) -> SchedulerStatistics:
    stats = ModelStatistics("m", "1", inference_count=pending, inference_stats=InferenceStats(success=Duration(1, 5)))
    return SchedulerStatistics({"m/1": VersionStatistics(stats, pending=pending)})


async def _replicas(nc, answers: list[bytes]) -> None:
    """One responder per answer on the scheduler's statistics subject, as replicas are."""
    for answer in answers:

        async def respond(msg: Msg, answer: bytes = answer) -> None:
            await msg.respond(answer)

        await nc.subscribe(subjects.SCHEDULER_STATS, cb=respond)
    await nc.flush()


async def test_a_malformed_reply_is_logged_and_the_others_are_merged(nats_server, caplog):
    nc = await connection.connect(nats_server.url, "test-stats")
    try:
        await _replicas(nc, [encode(_reply(2)), b"\x93not statistics", encode(_reply(3))])
        with caplog.at_level(logging.ERROR, "shoal.gateway"):
            merged = await scheduler_stats(nc)
        assert merged.versions["m/1"].pending == 5 and merged.versions["m/1"].stats.inference_count == 5
        assert merged.versions["m/1"].stats.inference_stats.success == Duration(2, 10)
        assert "undecodable statistics reply" in caplog.text
    finally:
        await nc.close()


async def test_no_readable_reply_is_unavailable(nats_server):
    nc = await connection.connect(nats_server.url, "test-stats-bad")
    try:
        await _replicas(nc, [b"{}", encode(ModelStatistics("m", "1"))])  # JSON; a Struct of another type
        with pytest.raises(ShoalError) as raised:
            await scheduler_stats(nc)
        assert raised.value.code == Code.UNAVAILABLE
    finally:
        await nc.close()


def test_a_version_no_scheduler_served_reads_all_zero():
    served = _reply(1)
    entries = model_entries(served, ["m", "n"], lambda model: (1, 2) if model == "m" else (3,))
    assert entries == [served.versions["m/1"].stats, ModelStatistics("m", "2"), ModelStatistics("n", "3")]
    assert model_entries(served, ["m"], lambda model: (1, 2), version="2") == [ModelStatistics("m", "2")]


def _counted(pending: int, replicas: int) -> bytes:
    reply = _reply(pending)
    reply.replicas = replicas
    return encode(reply)


async def test_a_late_replica_is_waited_for_when_the_replies_say_how_many_there_are(nats_server):
    """On a loaded machine one replica answers well after another: a sum without it is wrong.
    Each reply names the live replicas; the gather waits for them all (a second at most)."""
    nc = await connection.connect(nats_server.url, "test-stats-late")
    try:

        async def prompt(msg: Msg) -> None:
            await msg.respond(_counted(2, 2))

        async def late(msg: Msg) -> None:
            await asyncio.sleep(0.2)  # the slow replica: a stand-in for a busy process
            await msg.respond(_counted(3, 2))

        for cb in (prompt, late):
            await nc.subscribe(subjects.SCHEDULER_STATS, cb=cb)
        await nc.flush()
        merged = await scheduler_stats(nc)
        assert merged.versions["m/1"].pending == 5 and merged.replicas == 2
    finally:
        await nc.close()


async def test_a_replica_that_never_answers_costs_at_most_the_patience(nats_server):
    nc = await connection.connect(nats_server.url, "test-stats-gone")
    try:

        async def prompt(msg: Msg) -> None:
            await msg.respond(_counted(2, 3))  # counts a third replica that has died since

        await nc.subscribe(subjects.SCHEDULER_STATS, cb=prompt)
        await nc.flush()
        started = asyncio.get_running_loop().time()
        replies = await connection.gather(nc, subjects.SCHEDULER_STATS, declared=lambda r: 3, patience=0.3)
        assert len(replies) == 1 and asyncio.get_running_loop().time() - started < 5
    finally:
        await nc.close()

"""Asking the repository against a real nats-server: a repository that is away for a moment (its
subscription not there yet) is asked again within the caller's time; one that stays away is a
clear 503 when that time is up."""

from __future__ import annotations

import asyncio
import time

import msgspec
import nats
import pytest

from shared.bus.repository_client import repository_call
from shared.errors import ShoalError
from shared.wire.control import LoadRequest, RepositoryDone

SUBJECT = "test.repository.load"


async def test_a_repository_that_subscribes_a_moment_later_answers(nats_server):
    asker = await nats.connect(nats_server.url)
    repository = await nats.connect(nats_server.url)

    async def answer(msg) -> None:
        await msg.respond(msgspec.json.encode(RepositoryDone(revision=7)))

    async def comes_back() -> None:
        await asyncio.sleep(0.3)  # the repository's connection returns while the call waits
        await repository.subscribe(SUBJECT, cb=answer)
        await repository.flush()

    back = asyncio.create_task(comes_back())
    assert await repository_call(asker, SUBJECT, LoadRequest("m"), timeout=5) == 7
    await back
    await asker.close()
    await repository.close()


async def test_a_repository_that_stays_away_is_a_503_when_the_time_is_up(nats_server):
    asker = await nats.connect(nats_server.url)
    started = time.monotonic()
    with pytest.raises(ShoalError, match="the repository service is not available: NoRespondersError") as caught:
        await repository_call(asker, SUBJECT, LoadRequest("m"), timeout=0.6)
    assert caught.value.code == "UNAVAILABLE"
    assert 0.3 < time.monotonic() - started < 3
    await asker.close()


async def test_a_repository_that_stays_away_fails_within_seconds_whatever_the_timeout(nats_server, monkeypatch):
    """A load's timeout is minutes (it waits for the workers); a dead repository is not waited for."""
    from shared.bus import repository_client

    monkeypatch.setattr(repository_client, "AWAY_S", 0.5)
    asker = await nats.connect(nats_server.url)
    started = time.monotonic()
    with pytest.raises(ShoalError, match="NoRespondersError"):
        await repository_call(asker, SUBJECT, LoadRequest("m"), timeout=330)
    assert time.monotonic() - started < 3
    await asker.close()

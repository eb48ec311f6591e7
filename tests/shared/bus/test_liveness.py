"""Which workers count as gone: a loading worker gets longer, nobody is judged on a stale clock;
and, against a real nats-server, a worker whose connection is gone is dropped within about a
second whatever its heartbeat timeout, while a live one never is."""

from __future__ import annotations

import asyncio
import time

import nats
from hypothesis import given
from hypothesis import strategies as st

from shared.bus.liveness import LOADING_TIMEOUT_S, PROBE_S, WorkerLiveness, overdue
from shared.wire import subjects


def test_a_silent_worker_is_overdue_after_the_timeout():
    seen = {"a": 0.0, "b": 4.0}
    assert overdue(seen, set(), 5.5, 5.0) == ["a"]


def test_a_loading_worker_is_not_overdue_until_the_loading_timeout():
    seen = {"a": 0.0}
    assert overdue(seen, {"a"}, 30.0, 5.0) == []
    assert overdue(seen, {"a"}, LOADING_TIMEOUT_S + 1, 5.0) == ["a"]


@given(
    st.dictionaries(st.sampled_from("abcdef"), st.floats(0, 100)),
    st.sets(st.sampled_from("abcdef")),
    st.floats(0, 200),
    st.floats(0.1, 100),
)
def test_loading_never_shortens_the_timeout(seen, loading, now, timeout):
    assert set(overdue(seen, loading, now, timeout)) <= set(overdue(seen, set(), now, timeout))


async def _worker(url: str, worker: str) -> nats.NATS:
    """A worker's connection as the scheduler sees it: it answers on its liveness subject."""
    nc = await nats.connect(url)

    async def alive(msg) -> None:
        await msg.respond(b"")

    await nc.subscribe(subjects.worker_alive(worker), cb=alive)
    return nc


async def test_a_worker_whose_connection_closed_is_dropped_long_before_its_heartbeat_timeout(nats_server):
    nc = await nats.connect(nats_server.url)
    gone: list[str] = []

    async def on_gone(worker: str) -> None:
        gone.append(worker)

    liveness = WorkerLiveness(nc, 60.0, on_gone, probe=True)  # the heartbeat would take a minute
    await liveness.start()
    dead, live = await _worker(nats_server.url, "w-dead"), await _worker(nats_server.url, "w-live")
    liveness.heard("w-dead")
    liveness.heard("w-live")
    liveness.heard("w-never-answered")  # an older worker without the subject: left to its heartbeat
    started = time.monotonic()
    while not {"w-dead", "w-live"} <= liveness.answering:  # both answered a probe
        assert time.monotonic() - started < 10, liveness.answering
        await asyncio.sleep(0.05)
    await asyncio.sleep(2 * PROBE_S)  # two more rounds: "w-never-answered" gets no responders each time
    assert gone == [] and "w-never-answered" not in liveness.answering
    closed = time.monotonic()
    await dead.close()
    while "w-dead" not in gone and time.monotonic() - closed < 5:
        await asyncio.sleep(0.05)
    found = time.monotonic() - closed
    assert gone[:1] == ["w-dead"] and found < 2.5, (gone, found)
    assert "w-live" in liveness.seen and "w-never-answered" in liveness.seen and liveness.found_by_nats == 1
    liveness.stop()
    await live.close()
    await nc.close()

"""Which workers count as gone: a loading worker gets longer, nobody is judged on a stale clock;
and, against a real nats-server, a worker whose connection is gone is dropped within about a
second whatever its heartbeat timeout, while a live one never is, however late its heartbeats."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.bus import connection
from shared.bus.liveness import PATIENT_TIMEOUT_S, PROBE_S, WorkerLiveness, overdue, verdict
from shared.process.natsserver import NatsServer
from shared.wire import subjects
from shared.wire.messages import WorkerExited, WorkerHeartbeat, encode


def test_a_silent_worker_is_overdue_after_the_timeout():
    seen = {"a": 0.0, "b": 4.0}
    assert overdue(seen, set(), 5.5, 5.0) == ["a"]


def test_a_loading_worker_is_not_overdue_until_the_loading_timeout():
    seen = {"a": 0.0}
    assert overdue(seen, {"a"}, 30.0, 5.0) == []
    assert overdue(seen, {"a"}, PATIENT_TIMEOUT_S + 1, 5.0) == ["a"]


@given(
    st.dictionaries(st.sampled_from("abcdef"), st.floats(0, 100)),
    st.sets(st.sampled_from("abcdef")),
    st.floats(0, 200),
    st.floats(0.1, 100),
)
def test_loading_never_shortens_the_timeout(seen, loading, now, timeout):
    assert set(overdue(seen, loading, now, timeout)) <= set(overdue(seen, set(), now, timeout))


def test_an_overdue_worker_is_gone_only_when_nats_says_so_or_after_the_patient_timeout():
    assert not verdict(True, 1000.0)  # it answered: alive, however long its heartbeat was late
    assert verdict(False, 0.0)  # no responders: its connection is gone
    assert not verdict(None, PATIENT_TIMEOUT_S - 1)  # no answer in time: busy, its connection lives
    assert verdict(None, PATIENT_TIMEOUT_S + 1)  # that silent for that long: stuck


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


async def _busy_worker(url: str, worker: str) -> nats.NATS:
    """A worker whose loop is too busy to answer: NATS delivers to its subscription, nobody replies."""
    nc = await nats.connect(url)

    async def busy(msg) -> None:
        pass

    await nc.subscribe(subjects.worker_alive(worker), cb=busy)
    return nc


async def test_late_heartbeats_never_drop_a_worker_nats_holds(nats_server):
    """Issue 33: on a saturated machine heartbeats come seconds late. With no heartbeat at all for
    several timeouts, a worker that answers and one whose connection lives but does not answer stay;
    one that never had the subject and one whose connection closed go, each once."""
    nc = await nats.connect(nats_server.url)
    gone: list[str] = []

    async def on_gone(worker: str) -> None:
        gone.append(worker)

    liveness = WorkerLiveness(nc, 0.5, on_gone)  # as the repository uses it: no steady probe
    await liveness.start()
    answering, busy = await _worker(nats_server.url, "w-answers"), await _busy_worker(nats_server.url, "w-busy")
    closing = await _worker(nats_server.url, "w-closes")
    for worker in ("w-answers", "w-busy", "w-closes", "w-without-subject"):
        liveness.heard(worker)
    await closing.close()
    started = time.monotonic()
    while time.monotonic() - started < 4.0:  # eight heartbeat timeouts without a beat
        await asyncio.sleep(0.1)
    assert sorted(gone) == ["w-closes", "w-without-subject"], gone
    assert {"w-answers", "w-busy"} <= set(liveness.seen) and "w-answers" in liveness.answering
    liveness.stop()
    await answering.close()
    await busy.close()
    await nc.close()


async def test_a_python_model_process_is_dropped_when_its_worker_says_it_exited_and_never_probed(nats_server):
    """Hundreds of python model processes are not probed twice a second each: the worker that
    started one says when it exits (`WorkerExited`, by the id it was started with)."""
    nc = await nats.connect(nats_server.url)
    gone: list[str] = []

    async def on_gone(worker: str) -> None:
        gone.append(worker)

    liveness = WorkerLiveness(nc, 60.0, on_gone, probe=True)
    await liveness.start()
    child, other = "w-py-m-0-a1b2c3", "w-py-m-00-d4e5f6"  # started as "w-py-m-0" and "w-py-m-00"
    processes = [await _worker(nats_server.url, child), await _worker(nats_server.url, other)]
    for worker in (child, other):
        beat = WorkerHeartbeat(worker, "s", "h", {}, 1.0, supervised=True)
        await nc.publish(subjects.WORKER_HEARTBEAT, encode(beat))
    started = time.monotonic()
    while not {child, other} <= set(liveness.seen):
        assert time.monotonic() - started < 10
        await asyncio.sleep(0.05)
    await asyncio.sleep(3 * PROBE_S)
    assert liveness.answering == frozenset()  # never asked
    await nc.publish(subjects.WORKER_EXITED, encode(WorkerExited("w-py-m-0", -9)))
    while child not in gone and time.monotonic() - started < 10:
        await asyncio.sleep(0.05)
    assert gone == [child] and other in liveness.seen and liveness.found_by_parent == 1
    liveness.stop()
    for process in processes:
        await process.close()
    await nc.close()


async def test_the_processes_of_a_worker_that_is_gone_go_with_it(nats_server):
    """Python model processes die with the worker that started them: when NATS says it is gone,
    its processes (`<worker>-py-...`, never probed) are dropped too; another worker's stay."""
    nc = await nats.connect(nats_server.url)
    gone: list[str] = []

    async def on_gone(worker: str) -> None:
        gone.append(worker)

    liveness = WorkerLiveness(nc, 60.0, on_gone, probe=True)
    await liveness.start()
    parent, child, stranger = "w-abc123", "w-abc123-py-m-0-def456", "w2-abc123-py-m-0-def456"
    connections = {w: await _worker(nats_server.url, w) for w in (parent, child, stranger)}
    for worker in (parent, child, stranger):
        beat = WorkerHeartbeat(worker, "s", "h", {}, 1.0, supervised=worker != parent)
        await nc.publish(subjects.WORKER_HEARTBEAT, encode(beat))
    started = time.monotonic()
    while parent not in liveness.answering or len(liveness.seen) < 3:
        assert time.monotonic() - started < 10
        await asyncio.sleep(0.05)
    await connections[parent].close()
    while child not in gone and time.monotonic() - started < 10:
        await asyncio.sleep(0.05)
    assert gone == [parent, child] and stranger in liveness.seen
    liveness.stop()
    for worker in (child, stranger):
        await connections[worker].close()
    await nc.close()


async def _beating(url: str, worker: str, stop: asyncio.Event, connected: asyncio.Event | None = None) -> None:
    """A worker that beats every 0.2 s and answers on its liveness subject; with `connected`, it
    connects only once that is set (a worker that reaches a restarted server late)."""
    if connected is not None:
        await connected.wait()
    nc = await connection.connect(url, worker)

    async def alive(msg) -> None:
        await msg.respond(b"")

    await nc.subscribe(subjects.worker_alive(worker), cb=alive)
    while not stop.is_set():
        if nc.is_connected:
            await nc.publish(subjects.WORKER_HEARTBEAT, encode(WorkerHeartbeat(worker, "s", "h", {}, 0.2)))
        await asyncio.sleep(0.2)
    await nc.close()


@pytest.mark.parametrize("probe", [False, True])
async def test_a_nats_restart_drops_no_worker(probe):
    """nats-server is down for longer than the heartbeat timeout and comes back, and the worker
    reconnects a moment after this process: the outage was this process's deafness, and the new
    server's "no responders" before the worker is back says nothing about it."""
    gone: list[str] = []

    async def on_gone(worker: str) -> None:
        gone.append(worker)

    with NatsServer() as server:
        nc = await connection.connect(server.url, "liveness")
        liveness = WorkerLiveness(nc, 1.5, on_gone, probe=probe)
        await liveness.start()
        stop = asyncio.Event()
        first = asyncio.create_task(_beating(server.url, "w-first", stop))
        started = time.monotonic()
        while "w-first" not in liveness.seen or (probe and "w-first" not in liveness.answering):
            assert time.monotonic() - started < 10
            await asyncio.sleep(0.05)
        stop.set()
        await first  # its connection closes with the server: the worker is down too
        server.kill()
        await asyncio.sleep(2.0)  # longer than the timeout: nothing is heard
        server.start()
        while not nc.is_connected:
            assert time.monotonic() - started < 20
            await asyncio.sleep(0.05)
        stop = asyncio.Event()
        late = asyncio.Event()
        again = asyncio.create_task(_beating(server.url, "w-first", stop, late))
        await asyncio.sleep(0.7)  # this process asks (probe, overdue beats) while the worker is away
        late.set()
        await asyncio.sleep(3.0)  # two timeouts with the worker beating again
        assert gone == [] and "w-first" in liveness.seen
        stop.set()
        await again
        liveness.stop()
        await nc.close()


async def test_a_worker_back_is_welcomed_once_its_main_connection_answers(nats_server):
    """Its heartbeat comes over a connection of its own: `on_back` (report again, announce credits)
    waits until the worker's main connection answers, or what it sends would be lost."""
    nc = await nats.connect(nats_server.url)
    gone: list[str] = []
    back: list[str] = []

    async def on_gone(worker: str) -> None:
        gone.append(worker)

    async def on_back(worker: str) -> None:
        back.append(worker)

    liveness = WorkerLiveness(nc, 0.5, on_gone, on_back)
    await liveness.start()
    liveness.heard("w")  # no subject yet: its main connection is away
    started = time.monotonic()
    while gone != ["w"]:
        assert time.monotonic() - started < 10
        await asyncio.sleep(0.05)
    beats = await nats.connect(nats_server.url)  # the heartbeat thread's connection, back first
    for _ in range(8):
        await beats.publish(subjects.WORKER_HEARTBEAT, encode(WorkerHeartbeat("w", "s", "h", {}, 0.2)))
        await asyncio.sleep(0.2)
    assert back == [] and "w" in liveness.seen
    main = await _worker(nats_server.url, "w")
    returned = time.monotonic()
    while back != ["w"]:
        assert time.monotonic() - returned < 5, back
        await beats.publish(subjects.WORKER_HEARTBEAT, encode(WorkerHeartbeat("w", "s", "h", {}, 0.2)))
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    assert back == ["w"] and gone == ["w"]  # once
    liveness.stop()
    for connected in (beats, main, nc):
        await connected.close()

"""A scheduler SIGKILLed under load: its leases name a liveness subject that NATS then finds no
responders for, so the scheduler started in its place, or another replica, takes its models at
once instead of after the lease TTL (services/scheduler/replicas/takeover.py, docs/reliability.md).
A live holder's lease is not taken."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone

import msgspec
import nats
import numpy as np
import pytest
import tritonclient.http as httpclient
from nats.js.errors import KeyWrongLastSequenceError
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from services.repository import examples
from services.scheduler.replicas.leases import PRESENCE, TTL_S
from shared.wire import subjects
from shared.wire.records import Lease
from tests.cluster import Running, identity_config, running_cluster
from tests.serving import wait_until

MODEL = "steady"
KEY = subjects.model_key(MODEL)
VALUE = np.arange(4, dtype=np.float32).reshape(1, 4)


def infer(url: str) -> bool:
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(VALUE)
    try:
        return bool(np.array_equal(client.infer(MODEL, [tensor]).as_numpy("OUTPUT0"), VALUE))
    except InferenceServerException:
        return False
    finally:
        client.close()


@dataclass
class Load:
    """Clients inferring one request after another: (sent, ended, served) of each, monotonic."""

    url: str
    results: list[tuple[float, float, bool]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            sent = time.monotonic()
            served = infer(self.url)
            self.results.append((sent, time.monotonic(), served))

    def served(self) -> int:
        return sum(1 for _, _, ok in list(self.results) if ok)


@contextmanager
def steady_load(url: str, clients: int = 2) -> Iterator[Load]:
    load = Load(url)
    threads = [threading.Thread(target=load.run, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: load.served() > 0, 30, "the load served")
        yield load
    finally:
        load.stop.set()
        for thread in threads:
            thread.join(60)


def first_success(url: str, every_s: float = 0.25) -> float:
    """When (time.monotonic()) a request sent from now on is first served. A request waits up to
    `SCHEDULER_WAIT_S` for a scheduler, then fails: one is sent every `every_s`, so that the first
    success marks when a scheduler serves the model, not when a failed request was sent again."""
    ended: list[float] = []
    done = threading.Event()

    def one() -> None:
        if infer(url):
            ended.append(time.monotonic())
            done.set()

    threads: list[threading.Thread] = []
    deadline = time.monotonic() + 60
    while not done.wait(every_s if threads else 0):
        assert time.monotonic() < deadline, "no request served"
        threads.append(threading.Thread(target=one, daemon=True))
        threads[-1].start()
    for thread in threads:
        thread.join(60)
    return min(ended)


def connected_at(running: Running, scheduler_id: str) -> float:
    """When (time.time()) the scheduler process now running connected to nats-server."""
    name = f"shoal-scheduler-{scheduler_id}"
    (connection,) = [c for c in running.nats.monitor("connz")["connections"] if c.get("name") == name]
    start = connection["start"]  # RFC 3339 with nanoseconds, UTC
    whole, _, fraction = start.rstrip("Z").partition(".")
    return datetime.fromisoformat(whole).replace(tzinfo=timezone.utc).timestamp() + float(f"0.{fraction or 0}")


def write_model(root) -> None:
    examples.write_model(
        root, MODEL, examples.identity_graph(TensorProto.FLOAT, 2, MODEL), identity_config(MODEL, "FP32")
    )


def holder(value: bytes | None) -> Lease:
    return msgspec.msgpack.decode(value or b"", type=Lease)


async def _renewed(running: Running, renewals: int = 1) -> tuple[Lease, float]:
    """Once MODEL's lease was renewed `renewals` times from now: its holder and when the last
    renewal expires (time.time(), from nats-server's own timestamp of the write)."""
    nc = await nats.connect(running.nats.url)
    js, stream = nc.jetstream(), f"KV_{subjects.LEASES_BUCKET}"
    subject = f"$KV.{subjects.LEASES_BUCKET}.{KEY}"
    try:
        seen = (await js.get_msg(stream, subject=subject, direct=False)).seq
        deadline = time.monotonic() + 10 * renewals
        while renewals:
            assert time.monotonic() < deadline, "the lease was not renewed"
            entry = await js.get_msg(stream, subject=subject, direct=False)
            if entry.seq != seen:
                seen, renewals = entry.seq, renewals - 1
        assert entry.time is not None
        return holder(entry.data), entry.time.timestamp() + TTL_S
    finally:
        await nc.close()


def kill(running: Running, name: str) -> None:
    process = running.cluster.child(name).process
    assert process is not None
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


@pytest.mark.timeout(300)
def test_a_standby_replica_takes_a_killed_holders_model_before_its_lease_expires(tmp_path):
    write_model(tmp_path)
    with running_cluster(tmp_path, shape="standalone", schedulers=2, supervise=False, request_timeout_s=30) as running:
        names = {running.cluster.child(n).settings.scheduler_id: n for n in ("scheduler", "scheduler-1")}
        with steady_load(running.url) as load:
            # both alive: the one below its fair share asks the holder every round and takes nothing
            first, _ = asyncio.run(_renewed(running))
            standby = next(sid for sid in names if sid != first.holder)
            wait_until(lambda: asyncio.run(_present(running, standby)), 30, "the standby replica counted")
            still, expiry = asyncio.run(_renewed(running, 3))
            assert still == first, "a live holder's lease was taken"
            kill(running, names[first.holder])
            killed = time.monotonic()
            served = first_success(running.url)
            served_wall = time.time() - (time.monotonic() - served)
        figure = served - killed
        print(f"served {figure:.2f} s after the kill; load {os.getloadavg()[0]:.1f}")
        assert served_wall < expiry, f"served {served_wall - expiry:.2f} s after the dead lease expired"
        assert all(ok for _, _, ok in load.results), [r for r in load.results if not r[2]]


async def _present(running: Running, scheduler_id: str) -> bool:
    nc = await nats.connect(running.nats.url)
    try:
        kv = await nc.jetstream().key_value(subjects.LEASES_BUCKET)
        return f"{PRESENCE}{scheduler_id}" in await kv.keys()
    finally:
        await nc.close()


async def _keep_the_dead_lease(running: Running, dead: bytes, done: threading.Event) -> bytes:
    """Renew the dead process's lease as it would have (same value, compare-and-set) so that it
    never expires: only a take-over can end it. Returns the value that replaced it."""
    nc = await nats.connect(running.nats.url)
    try:
        kv = await nc.jetstream().key_value(subjects.LEASES_BUCKET)
        while not done.is_set():
            entry = await kv.get(KEY)
            if entry.value != dead:
                return entry.value or b""
            try:
                await kv.update(KEY, dead, last=entry.revision)
            except KeyWrongLastSequenceError:  # taken between the read and the renewal
                continue
            await asyncio.sleep(0.5)  # the renewal's cadence, well inside the TTL
        return (await kv.get(KEY)).value or b""  # what served the model
    finally:
        await nc.close()


@pytest.mark.timeout(300)
def test_a_restarted_scheduler_takes_the_killed_ones_lease(tmp_path):
    """The lone scheduler killed and started again: its old lease is kept alive by the test, so
    the new process serves only by taking it over (before, it waited out the TTL; here, for ever)."""
    write_model(tmp_path)
    with running_cluster(tmp_path, shape="standalone", supervise=False, request_timeout_s=30) as running:
        with steady_load(running.url):
            dead, _ = asyncio.run(_renewed(running))
            kill(running, "scheduler")
            running.cluster.restart("scheduler")
            started = running.cluster.child("scheduler").started
            done, taken = threading.Event(), []
            keeper = threading.Thread(
                target=lambda: taken.append(
                    asyncio.run(_keep_the_dead_lease(running, msgspec.msgpack.encode(dead), done))
                )
            )
            keeper.start()
            try:
                served = first_success(running.url)
            finally:
                done.set()
                keeper.join(30)
            connected = connected_at(running, dead.holder)
        after = time.time() - (time.monotonic() - served) - connected
        print(
            f"served {served - started:.2f} s after the new scheduler's start, {after:.2f} s after it connected "
            f"to NATS; load {os.getloadavg()[0]:.1f}"
        )
        assert after < TTL_S, after  # its first claim takes the lease over: no TTL to wait out
        new = holder(taken[0])
        assert new.holder == dead.holder and new.alive not in ("", dead.alive), (dead, new)

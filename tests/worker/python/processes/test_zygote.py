"""Python model processes forked from a warm zygote: each exit reported with its code, a signal
reaches the process, and a zygote that dies takes its processes with it and is started again."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from services.worker.python.processes.zygote import Zygote
from tests.serving import until


async def test_a_forked_process_runs_shoal_and_its_exit_code_comes_back():
    zygote = Zygote()
    try:
        helped = await zygote.spawn(["worker", "--help"])  # argparse prints the help and exits 0
        refused = await zygote.spawn(["no-such-command"])
        assert helped.pid != refused.pid and zygote.pid not in (helped.pid, refused.pid)
        assert await asyncio.wait_for(helped.wait(), 60) == 0
        assert await asyncio.wait_for(refused.wait(), 60) == 1 and refused.returncode == 1
    finally:
        await zygote.close()


async def test_an_exit_read_with_the_pid_before_spawn_resumes_still_comes_back():
    """A process that ends at once, on a loaded machine: its pid and its exit arrive together and are
    read before `spawn` resumes (the test's blocked loop makes that happen); its exit must come back."""
    zygote = Zygote()
    try:
        warm = await zygote.spawn(["worker", "--help"])  # the zygote has imported everything
        assert await asyncio.wait_for(warm.wait(), 60) == 0
        spawning = asyncio.create_task(zygote.spawn(["no-such-command"]))
        await asyncio.sleep(0)  # the request is written
        time.sleep(2)  # the loop blocked: meanwhile the process starts, fails and exits
        refused = await spawning
        assert await asyncio.wait_for(refused.wait(), 30) == 1
    finally:
        await zygote.close()


async def test_a_signal_reaches_the_forked_process_and_its_death_is_reported():
    zygote = Zygote()
    try:
        pid = await zygote.ready()
        # a worker that waits for a NATS server nobody runs: it lives until it is signalled
        process = await zygote.spawn(["worker", "--nats-url", "nats://127.0.0.1:1", "--parent-pid", str(pid)])
        await asyncio.sleep(0.5)
        process.kill()
        assert await asyncio.wait_for(process.wait(), 30) == -signal.SIGKILL
    finally:
        await zygote.close()


async def test_a_dead_zygote_takes_its_processes_and_is_started_again():
    zygote = Zygote()
    try:
        first = await zygote.ready()
        process = await zygote.spawn(["worker", "--nats-url", "nats://127.0.0.1:1", "--parent-pid", str(first)])
        os.kill(first, signal.SIGKILL)
        assert await asyncio.wait_for(process.wait(), 30) == -signal.SIGKILL  # reported as killed with it
        gone = lambda: not os.path.exists(f"/proc/{process.pid}") or "Z" in _state(process.pid)  # noqa: E731
        await until(gone, 10, "the forked process gone with its zygote")
        again = await zygote.spawn(["worker", "--help"])
        assert zygote.pid != first and await asyncio.wait_for(again.wait(), 60) == 0
    finally:
        await zygote.close()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"

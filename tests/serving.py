"""`shoal serve` as a real process for the reliability tests and benchmarks: its process tree,
its ports, and waiting for conditions with deadlines (no psutil: /proc is enough on Linux)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.utils import InferenceServerException

from shared.process.natsserver import free_port


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[1])


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it counts as gone)."""
    return parent_of(pid) is not None


def descendants(pid: int) -> list[int]:
    parents = {int(e): parent_of(int(e)) for e in os.listdir("/proc") if e.isdigit()}
    found, frontier = [], [pid]
    while frontier:
        children = [c for c, p in parents.items() if p in frontier]
        found += children
        frontier = children
    return found


def command_of(pid: int) -> str:
    """Its command line, then its name in brackets: a python model's process forked from the zygote
    has the zygote's command line and names itself `py<i>:<model>` (child_process.process_name)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace")
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f"{command} [{f.read().decode(errors='replace').strip()}]"
    except OSError:
        return ""


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_until(
    condition: Callable[[], object],
    timeout: float = 30.0,
    what: str = "a condition",
    step: float = 0.1,
    errors: tuple[type[Exception], ...] = (),
    detail: Callable[[], object] | None = None,
) -> float:
    """Seconds it took for `condition` to hold; AssertionError naming `what` past `timeout`, with
    `detail()` (what the test shows of the state it waited on) when given. The one deadline loop
    of the tests: a condition that must also check something else (a process still running)
    asserts it itself, which ends the wait at once.

    An exception of a type in `errors` counts as "not yet" (a model between generations answers
    with an error); the last one is named if the deadline passes."""
    started = time.monotonic()
    last = "false"
    while True:
        try:
            if condition():
                return time.monotonic() - started
        except errors as exc:
            last = str(exc)
        if time.monotonic() - started > timeout:
            shown = f": {detail()}" if detail is not None else ""
            raise AssertionError(f"{what}: not within {timeout}s (last: {last}){shown}")
        time.sleep(step)


async def until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "a condition") -> float:
    """`wait_until` for a test on an event loop: it awaits between checks, so the loop runs on."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.005)
    return time.monotonic() - started


def record_until(stop: threading.Event, results: list, attempt: Callable[[], bool]) -> None:
    """Call `attempt` until `stop`, each outcome appended as (started, ended, ok, error text); a
    failing client backs off 50 ms instead of spinning (the load loops of the reliability tests)."""
    while not stop.is_set():
        started = time.monotonic()
        try:
            ok, error = attempt(), ""
        except InferenceServerException as exc:
            ok, error = False, f"{exc.status()} {exc.message()}"
        results.append((started, time.monotonic(), ok, error))
        if not ok:
            time.sleep(0.05)


@dataclass
class Serve:
    """One `shoal serve` process on free ports, its log in `log_path`."""

    workdir: Path
    args: list[str] = field(default_factory=list)
    http_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    monitor_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)  # never Triton's 8001: another serve may hold it
    process: subprocess.Popen | None = None
    environment: dict[str, str] = field(default_factory=dict)  # set for the serve, beside this process's

    @property
    def log_path(self) -> Path:
        return self.workdir / "serve.log"

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, **self.environment, "XDG_CACHE_HOME": str(self.workdir / "cache")}

    def start(self, ready_timeout: float = 180, wait: bool = True) -> Serve:
        """Start it; with `wait`, return once it printed its model table (its start-up models
        loaded), else at once."""
        argv = [
            sys.executable,
            "-m",
            "shoal.cli",
            "serve",
            f"--http-port={self.http_port}",
            f"--metrics-port={self.metrics_port}",
            f"--nats-monitor-port={self.monitor_port}",
            f"--grpc-port={self.grpc_port}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            *self.args,
        ]
        self.workdir.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)

        def table() -> bool:
            assert self.process.poll() is None, self.log()[-4000:]
            return "| Model" in self.log()[offset:]

        if wait:
            wait_until(table, ready_timeout, "shoal serve printed no model table")
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def nats_url(self) -> str:
        # shoal.topology.record_serve writes it under $XDG_CACHE_HOME/shoal/serves/<http port>.json
        [state] = (self.workdir / "cache").rglob(f"{self.http_port}.json")
        return json.loads(state.read_text())["nats_url"]

    def tree(self) -> list[int]:
        return descendants(self.process.pid)

    def pids(self, needle: str) -> list[int]:
        return [pid for pid in self.tree() if needle in command_of(pid)]

    def ports(self) -> list[int]:
        nats = int(self.nats_url.rsplit(":", 1)[1])
        return [self.http_port, self.metrics_port, self.monitor_port, self.grpc_port, nats]

    def terminate(self, timeout: float) -> float:
        """SIGTERM; the seconds it took to exit (AssertionError past `timeout`)."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"shoal serve did not stop within {timeout}s") from None
        return time.monotonic() - started

    def kill_tree(self) -> None:
        """Clean-up after a failed test: nothing of this run may outlive it."""
        for pid in [self.process.pid, *self.tree()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.process.wait()

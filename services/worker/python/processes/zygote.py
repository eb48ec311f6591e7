"""Python model processes forked from one warm process instead of started from nothing.

A python model's process (one per instance by default: hundreds with a large repository) is a
worker for its one model. Started as `python -m shoal.cli worker ...`, each imports the same ~700
modules (numpy, nats-py, msgspec, pydantic, Shoal) on its own: 1 to 2 s of CPU per process, and
60 MB resident of which 38 MB are its own (proportional set size). So a worker starts one zygote
per worker: a process that imports all of that once, then forks each model process on request. A
fork shares the zygote's pages with it until either writes them (`gc.freeze()` first, so that the
collector does not), so each process's own share of memory is a fraction of an independent one's,
and it starts at once: only the model is imported in it.

The zygote is single-threaded and runs no event loop (a fork copies only the calling thread). It
dies with the worker (PR_SET_PDEATHSIG), and its processes die with it. It talks to the worker
over a socket pair, one JSON object per line:

    worker -> zygote   {"id": N, "argv": ["worker", "--models", ...]}
    zygote -> worker   {"id": N, "pid": P}            (or {"id": N, "error": "..."})
    zygote -> worker   {"exited": P, "code": C}       (C < 0: killed by signal -C, as asyncio says)

A model whose config sets EXECUTION_ENV_PATH still gets a process of its own interpreter
(services/worker/python/processes/isolation.py): its packages must come before Shoal's when it imports them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import importlib
import itertools
import json
import logging
import os
import select
import signal
import socket
import sys
import traceback

log = logging.getLogger("shoal.worker")

PRELOAD = (
    "numpy",
    "shoal.cli",
    "shared.process.runtime",
    "services.worker.service",
    "services.worker.python.hosting.python_backend",
)


ENTRY_POINT = "shoal.cli"  # what each forked process runs: `shoal <argv>`


# -- the zygote process ---------------------------------------------------------------


def _preload() -> None:
    from shared.bus.nats_import import import_nats_without_websockets

    import_nats_without_websockets()
    for module in PRELOAD:
        __import__(module)
    gc.collect()
    gc.freeze()  # the collector must not write to the pages every fork shares
    with contextlib.suppress(Exception):  # the heap the imports freed goes back: no fork inherits it
        ctypes.CDLL(None).malloc_trim(0)


def _child(channel: int, wakeup: tuple[int, int], argv: list[str]) -> None:
    """In the forked process: forget the zygote's plumbing, then be `shoal <argv>`."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for fd in (channel, *wakeup):
            os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        # the `shoal` command, by name as a subprocess's command line names it (services/ import
        # nothing of shoal/, the entry points above them)
        importlib.import_module(ENTRY_POINT).main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _send(channel: int, message: dict) -> None:
    data = json.dumps(message).encode() + b"\n"
    while data:
        data = data[os.write(channel, data) :]


def _reap(channel: int) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(channel, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def serve(worker_pid: int, channel: int) -> None:
    """The zygote's loop: fork on request, report each exit, end when the worker closes the channel."""
    from shared.process import lifeline

    lifeline.die_with(worker_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker stops the processes, then closes the channel
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _preload()
    wakeup = os.pipe()
    os.set_blocking(wakeup[1], False)
    signal.set_wakeup_fd(wakeup[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the poll through the wakeup fd
    poller = select.poll()  # not select(): a worker's descriptors may number past FD_SETSIZE
    for fd in (channel, wakeup[0]):
        poller.register(fd, select.POLLIN)
    pending = b""
    while True:
        try:
            ready = {fd for fd, _ in poller.poll()}
        except InterruptedError:
            continue
        if wakeup[0] in ready:
            os.read(wakeup[0], 4096)
            _reap(channel)
        if channel not in ready:
            continue
        data = os.read(channel, 65536)
        if not data:
            return  # the worker is done (or gone): the processes die with this one
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            try:
                pid = os.fork()
            except OSError as exc:
                _send(channel, {"id": request["id"], "error": str(exc)})
                continue
            if pid == 0:
                _child(channel, wakeup, request["argv"])
            _send(channel, {"id": request["id"], "pid": pid})


# -- the worker's side ----------------------------------------------------------------


class Forked:
    """A process the zygote forked, as much of `asyncio.subprocess.Process` as isolation uses."""

    def __init__(self, pid: int, exited: asyncio.Future[int]) -> None:
        self.pid = pid
        self._exited = exited

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if not self._exited.done():  # an exited pid may be another process's already
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The worker's handle on its zygote, started on first use and again if it dies."""

    def __init__(self) -> None:
        self.process: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._ids = itertools.count()
        self._spawning: dict[int, asyncio.Future[Forked]] = {}
        self._exits: dict[int, asyncio.Future[int]] = {}  # by pid: the exit codes still to come
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else 0

    async def _ensure(self) -> None:
        if self.process is not None and self.process.returncode is None and self._writer is not None:
            return
        if self._writer is not None:  # the channel to a zygote that died
            self._writer.close()
        mine, theirs = socket.socketpair()
        try:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "services.worker.python.processes.zygote",
                str(os.getpid()),
                str(theirs.fileno()),
                pass_fds=[theirs.fileno()],
                stdin=asyncio.subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=mine)
        self._reader_task = asyncio.create_task(self._read(reader))
        log.info("python model processes fork from process %d", self.process.pid)

    async def spawn(self, argv: list[str]) -> Forked:
        """Fork `shoal <argv>` (its `--parent-pid` must be this zygote's pid: `pid` after `ready`)."""
        async with self._lock:
            await self._ensure()
        request = next(self._ids)
        spawned: asyncio.Future[Forked] = asyncio.get_running_loop().create_future()
        self._spawning[request] = spawned
        assert self._writer is not None
        self._writer.write(json.dumps({"id": request, "argv": argv}).encode() + b"\n")
        await self._writer.drain()
        return await spawned

    async def ready(self) -> int:
        """Start the zygote if it is not running; its pid."""
        async with self._lock:
            await self._ensure()
        return self.pid

    async def _read(self, reader: asyncio.StreamReader) -> None:
        loop = asyncio.get_running_loop()
        try:
            while line := await reader.readline():
                message = json.loads(line)
                if "exited" in message:
                    exited = self._exits.setdefault(message["exited"], loop.create_future())
                    if not exited.done():
                        exited.set_result(message["code"])
                    self._exits.pop(message["exited"], None)
                    continue
                spawned = self._spawning.pop(message["id"], None)
                if spawned is None or spawned.done():
                    continue
                if "pid" in message:  # its exit future made now: the exit may be the next line, read
                    # before `spawn` resumes (a process that ends at once, on a loaded machine)
                    pid = message["pid"]
                    spawned.set_result(Forked(pid, self._exits.setdefault(pid, loop.create_future())))
                else:
                    spawned.set_exception(OSError(message.get("error", "fork failed")))
        finally:  # the zygote is gone, and every process it forked with it (PR_SET_PDEATHSIG)
            if self._writer is not None:
                self._writer.close()
            self._writer = None
            for spawned in self._spawning.values():
                if not spawned.done():
                    spawned.set_exception(OSError("the zygote of python model processes is gone"))
            for exited in self._exits.values():
                if not exited.done():
                    exited.set_result(-signal.SIGKILL)
            self._spawning.clear()
            self._exits.clear()

    async def close(self) -> None:
        """After the processes it forked have stopped: the zygote ends when its channel closes."""
        if self._writer is not None:
            self._writer.close()
        if self.process is not None and self.process.returncode is None:
            try:
                await asyncio.wait_for(self.process.wait(), 5)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()
        if self._reader_task is not None:
            self._reader_task.cancel()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))

"""Python-backend models in worker processes of their own (`--python-isolation process`).

A python model runs arbitrary code: it can segfault, call `os._exit`, leak or hold the
GIL. So a worker does not host python models itself; it starts one child worker per
python model (`shoal worker --models <that model>`) and restarts it when it dies. The
child is a complete worker: the scheduler sends it batches directly, tensors reach it
through the same shared memory as any worker, BLS and decoupled responses work as
anywhere. So isolation costs no extra bus hop and none of the copies Triton's stub
processes make (docs/triton-spec.md §7 rows 1, 2 and 16): only a process per model.

A child that dies while its model is loading is not restarted in a loop: the load fails
with the exit status (as Triton fails a load whose stub dies), and the next load of the
model (a new generation) starts it again.

With `--python-isolation none` python models run in the worker's own process, on their
instance threads; a crash then takes the worker and its other models down.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import glob
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable

from shared.config.backend_config import python_based_runtime
from shared.process.settings import WorkerSettings, to_argv
from shared.wire import subjects

log = logging.getLogger("shoal.worker")

RESTART_BACKOFF_MAX_S = 10.0
STOP_TIMEOUT_S = 10.0
PR_SET_PDEATHSIG = 1

# (model, child worker id, exit code, seconds it lived) -> whether the child died while loading
# (it then waits for the next generation instead of restarting)
CrashReport = Callable[[str, str, int, float], Awaitable[bool]]


def die_with_parent(parent_pid: int) -> None:
    """Called by a child worker at start: if the worker that started it dies (even by SIGKILL),
    the child is killed too, as abruptly (its in-flight requests fail as "stopped responding")."""
    if not parent_pid:
        return
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


class ModelProcesses:
    def __init__(self, settings: WorkerSettings, parent_id: str, on_crash: CrashReport) -> None:
        self.settings = settings
        self.parent_id = parent_id
        self.on_crash = on_crash
        self.children: dict[str, asyncio.Task] = {}
        self.stopping = False
        self._generations: dict[str, int] = {}
        self._new_generation: dict[str, asyncio.Event] = {}
        self._environ: dict[str, dict[str, str]] = {}  # model -> what its process adds (EXECUTION_ENV_PATH)

    def child_id(self, model: str) -> str:
        return f"{self.parent_id}-py-{subjects.token(model)}"

    def child_settings(self, model: str) -> WorkerSettings:
        return self.settings.model_copy(
            update={
                "worker_id": self.child_id(model),
                "models": [glob.escape(model)],  # exactly this model (the selector takes globs)
                "python_isolation": "none",
                "parent_pid": os.getpid(),
            }
        )

    def environ_changed(self, model: str, environ: dict[str, str]) -> bool:
        """Whether `model`'s process runs with other environment variables than its config now asks
        (a new EXECUTION_ENV_PATH): it must be stopped and started again."""
        return model in self.children and self._environ.get(model, {}) != environ

    def ensure(self, model: str, generation: int, environ: dict[str, str] | None = None) -> bool:
        """Keep a process for `model` running; True when this is a new generation of it."""
        self._environ[model] = environ or {}
        new = self._generations.get(model) != generation
        if new:
            self._generations[model] = generation
            self._new_generation.setdefault(model, asyncio.Event()).set()
        if model not in self.children:
            self.children[model] = asyncio.create_task(self._keep_running(model))
        return new

    async def stop(self, model: str) -> None:
        task = self.children.pop(model, None)
        self._generations.pop(model, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def stop_all(self) -> None:
        self.stopping = True
        await asyncio.gather(*(self.stop(model) for model in list(self.children)))

    async def _keep_running(self, model: str) -> None:
        restarts = 0
        while True:
            started = time.monotonic()
            self._new_generation.setdefault(model, asyncio.Event()).clear()
            process = await self._start(model)
            try:
                code = await process.wait()
            except asyncio.CancelledError:
                await self._terminate(process)
                raise
            if self.stopping:
                return
            if await self.on_crash(model, self.child_id(model), code, time.monotonic() - started):
                log.error(
                    "the process of python model '%s' exited with code %s while loading it; the load "
                    "failed, the next load starts it again",
                    model,
                    code,
                )
                await self._new_generation[model].wait()
                continue
            restarts = restarts + 1 if time.monotonic() - started < 30 else 1
            delay = min(RESTART_BACKOFF_MAX_S, 0.25 * 2 ** min(restarts, 6))
            log.error(
                "the process of python model '%s' exited with code %s; restarting it in %.1f s", model, code, delay
            )
            await asyncio.sleep(delay)

    async def _start(self, model: str) -> asyncio.subprocess.Process:
        argv = [sys.executable, "-m", "shoal.cli", "worker", *to_argv(self.child_settings(model))]
        process = await asyncio.create_subprocess_exec(*argv, env={**os.environ, **self._environ.get(model, {})})
        log.info("python model '%s' runs in process %d", model, process.pid)
        return process

    @staticmethod
    async def _terminate(process: asyncio.subprocess.Process) -> None:
        if process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)  # it unloads the model and reports that
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()


def isolated(settings: WorkerSettings, config: dict) -> bool:
    """Whether this worker hosts `config`'s model in a child process: a python model, or a model
    of a python-based backend (`<backend-directory>/<backend>/model.py`)."""
    if settings.python_isolation != "process":
        return False
    backend = config.get("backend", "")
    return backend == "python" or python_based_runtime(settings.backend_directory, backend) is not None

"""Python-backend models in worker processes of their own (`--python-isolation process`).

A python model runs arbitrary code: it can segfault, call `os._exit`, leak or hold the
GIL. So a worker does not host python models itself; it starts one child worker per
python model (`shoal worker --models <that model>`) and restarts it when it dies. The
child is a complete worker: the scheduler sends it batches directly, tensors reach it
through the same shared memory as any worker, BLS and decoupled responses work as
anywhere. So isolation costs no extra bus hop and none of the copies Triton's stub
processes make (triton-spec §7 rows 1, 2 and 16): only a process per model.

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

from shared import subjects
from shared.settings import WorkerSettings, to_argv

log = logging.getLogger("shoal.worker")

RESTART_BACKOFF_MAX_S = 10.0
STOP_TIMEOUT_S = 10.0


def _die_with_parent() -> None:
    """Runs in the child before exec: a SIGKILLed worker must not leave its model processes behind."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ModelProcesses:
    def __init__(self, settings: WorkerSettings, parent_id: str) -> None:
        self.settings = settings
        self.parent_id = parent_id
        self.children: dict[str, asyncio.Task] = {}

    def child_settings(self, model: str) -> WorkerSettings:
        return self.settings.model_copy(update={
            "worker_id": f"{self.parent_id}-py-{subjects.token(model)}",
            "models": [glob.escape(model)],  # exactly this model (the selector takes globs)
            "python_isolation": "none",
        })

    def ensure(self, model: str) -> None:
        if model not in self.children:
            self.children[model] = asyncio.create_task(self._keep_running(model))

    async def stop(self, model: str) -> None:
        task = self.children.pop(model, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def stop_all(self) -> None:
        for model in list(self.children):
            await self.stop(model)

    async def _keep_running(self, model: str) -> None:
        restarts = 0
        while True:
            started = time.monotonic()
            process = await self._start(model)
            try:
                code = await process.wait()
            except asyncio.CancelledError:
                await self._terminate(process)
                raise
            restarts = restarts + 1 if time.monotonic() - started < 30 else 1
            delay = min(RESTART_BACKOFF_MAX_S, 0.25 * 2 ** min(restarts, 6))
            log.error("the process of python model '%s' exited with code %s; restarting it in %.1f s",
                      model, code, delay)
            await asyncio.sleep(delay)

    async def _start(self, model: str) -> asyncio.subprocess.Process:
        argv = [sys.executable, "-m", "shared.cli", "worker", *to_argv(self.child_settings(model))]
        process = await asyncio.create_subprocess_exec(*argv, env=dict(os.environ), preexec_fn=_die_with_parent)
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
    """Whether this worker hosts `config`'s model in a child process."""
    return settings.python_isolation == "process" and config.get("backend") == "python"

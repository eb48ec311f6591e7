"""Python-backend models in worker processes of their own (`--python-isolation instance|model`).

A python model runs arbitrary code: it can segfault, call `os._exit`, leak or hold the GIL. So a
worker does not host python models itself. By default (`instance`) it starts one child worker per
*instance* of each python model, as Triton starts a stub process per instance: `shoal worker
--models <model> --instance-index <i>`, and restarts each one that dies. `count: N` then runs N
`execute` calls at once even when they are pure Python holding the GIL, and a crash takes down
only its instance: its in-flight batches fail, the other instances go on serving while it comes
back. With `model` one child hosts every instance of the model, as threads (one GIL between them).

Each child is a complete worker: the scheduler sends it batches directly (an instance process's
one instance has its own credits), tensors reach it through the same shared memory as any worker,
BLS and decoupled responses work as anywhere, a sequence stays on the instance (the process) that
holds its state. So isolation costs no extra bus hop and none of the copies Triton's stub
processes make (docs/triton-spec.md §7 rows 1, 2 and 16): only a process per instance. The
instance processes of one model report under one group (`instance_group`, with the group's size):
the repository counts the model loaded once every instance has loaded, and failed if one failed.

A child that dies while its model is loading is not restarted in a loop: the load fails
with the exit status (as Triton fails a load whose stub dies), and the next load of the
model (a new generation) starts it again.

With `--python-isolation none` python models run in the worker's own process, on their
instance threads; a crash then takes the worker and its other models down.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable

from services.worker.python.processes.zygote import Forked, Zygote
from shared.config.backend_config import python_based_runtime
from shared.process.settings import WorkerSettings, to_argv
from shared.wire import subjects

log = logging.getLogger("shoal.worker")

RESTART_BACKOFF_MAX_S = 10.0
STOP_TIMEOUT_S = 10.0


Process = asyncio.subprocess.Process | Forked  # started on its own, or forked by the zygote

# (model, child worker id, exit code, seconds it lived) -> whether the child died while loading
# (it then waits for the next generation instead of restarting)
CrashReport = Callable[[str, str, int, float], Awaitable[bool]]


WHOLE_MODEL = -1  # the index of a process that hosts every instance of its model (`model` isolation)


class ModelProcesses:
    """The child processes of this worker's python models: for each model, one per instance
    (index 0..N-1) or one for the whole model (`WHOLE_MODEL`), each kept running."""

    def __init__(self, settings: WorkerSettings, parent_id: str, on_crash: CrashReport) -> None:
        self.settings = settings
        self.parent_id = parent_id
        self.on_crash = on_crash
        self.children: dict[str, dict[int, asyncio.Task]] = {}  # model -> index -> the task keeping it running
        self.stopping = False
        self._generations: dict[str, int] = {}
        self._new_generation: dict[tuple[str, int], asyncio.Event] = {}
        self._environ: dict[str, dict[str, str]] = {}  # model -> what its processes add (EXECUTION_ENV_PATH)
        self.zygote = Zygote()  # the processes fork from it (zygote.py)

    def group_id(self, model: str) -> str:
        """The id the model's processes report under together (the process's own id, for `model`)."""
        return f"{self.parent_id}-py-{subjects.token(model)}"

    def child_id(self, model: str, index: int = WHOLE_MODEL) -> str:
        return self.group_id(model) + (f"-{index}" if index != WHOLE_MODEL else "")

    def child_settings(self, model: str, index: int = WHOLE_MODEL) -> WorkerSettings:
        return self.settings.model_copy(
            update={
                "worker_id": self.child_id(model, index),
                "models": [glob.escape(model)],  # exactly this model (the selector takes globs)
                "python_isolation": "none",
                "parent_pid": os.getpid(),
                "instance_index": index,
                "instance_group": self.group_id(model) if index != WHOLE_MODEL else "",
                # the process runs the model's own code: it is an `instance` on the bus (docs/security.md)
                "nats_credentials": self.settings.instance_credentials or self.settings.nats_credentials,
                "instance_credentials": "",
                "health_port": 0,  # the worker's port is the worker's: a child binding it too would fail
            }
        )

    def hosts(self, model: str) -> bool:
        return model in self.children

    def environ_changed(self, model: str, environ: dict[str, str]) -> bool:
        """Whether `model`'s processes run with other environment variables than its config now asks
        (a new EXECUTION_ENV_PATH): they must be stopped and started again."""
        return model in self.children and self._environ.get(model, {}) != environ

    async def ensure(
        self, model: str, generation: int, environ: dict[str, str] | None = None, instances: int | None = None
    ) -> bool:
        """Keep `model`'s processes running: one per instance (`instances` of them), or one for the
        whole model (None). True when this is a new generation of it. A reload that changes the
        number of instances starts the new ones and stops those beyond it."""
        self._environ[model] = environ or {}
        indexes = [WHOLE_MODEL] if instances is None else list(range(max(1, instances)))
        running = self.children.setdefault(model, {})
        for index in [i for i in running if i not in indexes]:
            await self._stop_one(model, index)
        new = self._generations.get(model) != generation
        if new:
            self._generations[model] = generation
            for index in indexes:
                self._new_generation.setdefault((model, index), asyncio.Event()).set()
        for index in indexes:
            if index not in running:
                running[index] = asyncio.create_task(self._keep_running(model, index))
        return new

    async def stop(self, model: str) -> None:
        self._generations.pop(model, None)
        await asyncio.gather(*(self._stop_one(model, index) for index in list(self.children.get(model, {}))))
        self.children.pop(model, None)

    async def _stop_one(self, model: str, index: int) -> None:
        task = self.children.get(model, {}).pop(index, None)
        self._new_generation.pop((model, index), None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def stop_all(self) -> None:
        self.stopping = True
        await asyncio.gather(*(self.stop(model) for model in list(self.children)))
        await self.zygote.close()  # after its processes: they would die with it

    async def _keep_running(self, model: str, index: int) -> None:
        restarts = 0
        what = f"python model '{model}'" + (f" instance {index}" if index != WHOLE_MODEL else "")
        while True:
            started = time.monotonic()
            new_generation = self._new_generation.setdefault((model, index), asyncio.Event())
            new_generation.clear()
            process = await self._start(model, index)
            try:
                code = await process.wait()
            except asyncio.CancelledError:
                await self._terminate(process)
                raise
            if self.stopping:
                return
            if await self.on_crash(model, self.child_id(model, index), code, time.monotonic() - started):
                log.error(
                    "the process of %s exited with code %s while loading it; the load failed, the next "
                    "load starts it again",
                    what,
                    code,
                )
                await new_generation.wait()
                continue
            restarts = restarts + 1 if time.monotonic() - started < 30 else 1
            delay = min(RESTART_BACKOFF_MAX_S, 0.25 * 2 ** min(restarts, 6))
            log.error("the process of %s exited with code %s; restarting it in %.1f s", what, code, delay)
            await asyncio.sleep(delay)

    async def _start(self, model: str, index: int) -> Process:
        settings, environ = self.child_settings(model, index), self._environ.get(model, {})
        process: Process | None = None
        if self.settings.python_fork and not environ:  # an EXECUTION_ENV_PATH needs its own interpreter
            try:
                zygote = await self.zygote.ready()
                argv = ["worker", *to_argv(settings.model_copy(update={"parent_pid": zygote}))]
                process = await self.zygote.spawn(argv)
            except OSError as exc:
                log.warning("cannot fork the process of python model '%s' (%s): starting it on its own", model, exc)
        if process is None:
            argv = [sys.executable, "-m", "shoal.cli", "worker", *to_argv(settings)]
            process = await asyncio.create_subprocess_exec(*argv, env={**os.environ, **environ})
        if index == WHOLE_MODEL:
            log.info("python model '%s' runs in process %d", model, process.pid)
        else:
            log.info("python model '%s' instance %d runs in process %d", model, index, process.pid)
        return process

    @staticmethod
    async def _terminate(process: Process) -> None:
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
    if settings.python_isolation not in ("instance", "model"):
        return False
    backend = config.get("backend", "")
    return backend == "python" or python_based_runtime(settings.backend_directory, backend) is not None

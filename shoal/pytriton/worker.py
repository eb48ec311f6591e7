"""This process as a Shoal worker for the functions it bound.

A `WorkerService` runs on an event loop of its own thread, hosting only the models registered
in its `InProcessModels`. A model reaches the cluster through the repository's load API with a
config override (the repository stays the single writer of configs); a process joining a
cluster where the same binding is loaded already just starts serving it too.

Leaving: the last process serving a model unloads it (the repository drains the queued
requests first, which this process still serves); any other process only withdraws its own
instances (the scheduler stops sending to them; what they run finishes) and the others go on.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Coroutine
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from services.worker.python.hosting.callables import IN_PROCESS, InProcessModels
from services.worker.service import WorkerService
from shared.bus import buckets, connection
from shared.bus.repository_client import repository_call
from shared.errors import Code, ShoalError
from shared.process.settings import WorkerSettings
from shared.wire import subjects
from shared.wire.control import LoadRequest, UnloadRequest
from shared.wire.records import InstanceRecord, ModelRecord
from shoal.pytriton.binding import Binding

log = logging.getLogger("shoal.pytriton")

LOAD_TIMEOUT_S = 300.0
PLACEHOLDER = '''"""Served by the Python process that bound a function to this model (shoal.pytriton).

Workers other than that process never load this file (the config's `shoal-in-process` parameter).
"""


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("this model is served by the process that bound it with shoal.pytriton's Triton.bind")
'''


class InProcessWorker:
    def __init__(self, nats_url: str, log_verbose: int = 0, credentials: str = "") -> None:
        self.models = InProcessModels()
        settings: dict[str, Any] = {
            "nats_url": nats_url,
            "nats_credentials": credentials,
            "log_verbose": log_verbose,
            "worker_id": f"pytriton-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}",
            "python_isolation": "none",  # the functions live in this process: nothing to isolate them in
        }
        self.settings = WorkerSettings(**settings)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="shoal-pytriton-worker", daemon=True)
        self._nc: NATS | None = None
        self._service: WorkerService | None = None

    @property
    def nc(self) -> NATS:
        assert self._nc is not None, "the worker is not started"
        return self._nc

    @property
    def service(self) -> WorkerService:
        assert self._service is not None, "the worker is not started"
        return self._service

    # -- the loop's thread --------------------------------------------------------------
    def call(self, coroutine: Coroutine[Any, Any, Any], timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        self.call(self._start(), timeout)

    async def _start(self) -> None:
        self._nc = await connection.connect(
            self.settings.nats_url, f"shoal-pytriton-{os.getpid()}", self.settings.nats_credentials
        )
        self._service = WorkerService(self.settings, self._nc, local=self.models)
        await self.service.start()
        self.instances_kv = await buckets.bucket(self.nc, subjects.INSTANCES_BUCKET)
        self.models_kv = await buckets.bucket(self.nc, subjects.MODELS_BUCKET, create=False)

    def stop(self, timeout: float = 30.0) -> None:
        try:
            self.call(self._stop(), timeout)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)

    async def _stop(self) -> None:
        if self._service is not None:
            await self._service.stop()
        if self._nc is not None:
            await self._nc.drain()
        # what the bus client left running (JetStream watchers) ends here, not as "destroyed" tasks
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    # -- models -------------------------------------------------------------------------
    def serve_model(self, binding: Binding, timeout: float = LOAD_TIMEOUT_S) -> None:
        """Register the binding's functions and make sure the cluster has the model (ours READY)."""
        self.models.register(binding.name, binding)
        self.call(self._serve_model(binding, timeout), timeout + 5)

    async def _serve_model(self, binding: Binding, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        record = await self._record(binding.name)
        if record is not None and record.hosted and _fingerprint(record.config) == _fingerprint(binding.config()):
            # loaded already by another process with this very binding: host it as it is (the worker
            # saw the record before the function was registered, so it has to look again)
            await self.service.lifecycle.apply(binding.name, record)
            if await self._wait_serving(binding.name, binding.version, deadline):
                return
        parameters = {
            "config": msgspec.json.encode(binding.config()).decode(),
            # a load with a config of a model the repository has no directory for needs files (as in
            # Triton): the version directory, with a model.py saying where the model really runs
            f"file:{binding.version}/model.py": base64.b64encode(PLACEHOLDER.encode()).decode(),
        }
        request = LoadRequest(binding.name, parameters)
        await repository_call(self.nc, subjects.REPOSITORY_LOAD, request, max(1.0, deadline - time.monotonic()))
        if not await self._wait_serving(binding.name, binding.version, deadline):
            raise ShoalError(f"model '{binding.name}' did not become ready in {timeout:.0f}s", Code.UNAVAILABLE)

    async def _record(self, name: str) -> ModelRecord | None:
        try:
            entry = await self.models_kv.get(subjects.model_key(name))
        except Exception:  # no such key
            return None
        return msgspec.msgpack.decode(entry.value, type=ModelRecord) if entry.value else None

    async def _wait_serving(self, name: str, version: int, deadline: float) -> bool:
        while time.monotonic() < deadline:
            loaded = self.service.lifecycle.models.get((name, version))
            if loaded is not None and not loaded.retired:
                return True
            await asyncio.sleep(0.05)
        return False

    def remove_model(self, binding: Binding, timeout: float) -> None:
        self.call(self._remove_model(binding, timeout), timeout + 5)

    async def _remove_model(self, binding: Binding, timeout: float) -> None:
        if await self._others_serve(binding.name):
            self.models.unregister(binding.name)  # the KV watch must not bring it back
            await self._withdraw(binding, timeout)
            return
        try:  # the last one: the repository drains its queue (we serve it meanwhile), then unloads
            await repository_call(self.nc, subjects.REPOSITORY_UNLOAD, UnloadRequest(binding.name), timeout)
        except ShoalError as exc:
            log.warning("unloading '%s': %s", binding.name, exc.message)
        finally:
            self.models.unregister(binding.name)
            await self._withdraw(binding, timeout)

    async def _others_serve(self, name: str) -> bool:
        try:
            keys = await self.instances_kv.keys()
        except Exception:  # an empty bucket
            return False
        for key in keys:
            entry = await self.instances_kv.get(key)
            if not entry.value:
                continue
            report = msgspec.msgpack.decode(entry.value, type=InstanceRecord)
            if report.model == name and report.worker != self.service.id and report.serving_generation > 0:
                return True
        return False

    async def _withdraw(self, binding: Binding, timeout: float) -> None:
        """Give back our instances' credits, then wait for the batches they run to finish."""
        key = (binding.name, binding.version)
        loaded = self.service.lifecycle.models.get(key)
        if loaded is None:
            return
        await self.service.lifecycle.unload(key)
        deadline = time.monotonic() + timeout
        while any(instance.busy for instance in loaded.instances) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)


def _fingerprint(config: dict) -> str:
    return ((config.get("parameters") or {}).get(IN_PROCESS) or {}).get("string_value", "")

"""Everything a front end answers besides inference, as plain documents: health, server and model
metadata, model configs, statistics, the model repository, trace and log settings.

HTTP renders these documents as JSON and gRPC converts them to protobuf messages, so both
answer the same thing with the same errors (Triton's texts, `ShoalError` codes).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from inference.core import InferenceCore
from inference.model_readiness import NO_USER_CHECK, HostedInstances
from inference.models import ModelRegistry
from inference.replica_statistics import model_entries, scheduler_stats
from inference.repository_startup import RepositoryStartup
from inference.shm import ShmRegistry
from inference.trace import Tracer
from shared.bus.repository_client import RepositoryRequest, repository_call
from shared.config.model_config import TensorSpec
from shared.errors import ShoalError, invalid, unavailable
from shared.process import logsettings
from shared.wire import subjects
from shared.wire.control import IndexRequest, LoadRequest, LogSettings, RepositoryIndex, UnloadRequest
from shared.wire.statistics import ModelStatistics

log = logging.getLogger("shoal.gateway")

SERVER_VERSION = "2.73.0"  # the Triton protocol level Shoal answers as
# tritonserver's list and order (docs/triton-spec.md §1.4): clients compare it; Triton serves
# `generate` without naming it, so Shoal does not name it either
EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
]


class InferenceServer:
    def __init__(
        self,
        nc: NATS,
        core: InferenceCore,
        shm: ShmRegistry,
        tracer: Tracer,
        server_id: str,
        strict_readiness: bool,
        repository_timeout_s: float,
        log_verbose: int = 0,
        startup: RepositoryStartup | None = None,
    ) -> None:
        self.nc = nc
        self.core = core
        self.registry: ModelRegistry = core.registry
        self.shm = shm
        self.tracer = tracer
        self.server_id = server_id
        self.strict_readiness = strict_readiness
        self.repository_timeout_s = repository_timeout_s
        self.log_settings = LogSettings(log_verbose_level=log_verbose)
        self.startup = startup  # None: readiness does not wait for the repository's start-up set
        self.hosted = HostedInstances(nc)  # started by the gateway (`start`)

    # -- health and metadata --------------------------------------------------------------
    def ready(self) -> bool:
        """tritonserver's readiness: its start-up models tried (each READY or failed), and with
        strict readiness every model READY. Before it has heard what the repository loads at
        start, a gateway is not ready (inference/repository_startup.py)."""
        if not self.registry.synced.is_set():
            return False
        if self.startup is not None and not self.startup.settled():
            return False
        return not self.strict_readiness or self.registry.all_ready()

    def metadata(self) -> dict[str, Any]:
        return {"name": self.server_id, "version": SERVER_VERSION, "extensions": EXTENSIONS}

    async def model_is_ready(self, name: str, version: str = "") -> bool:
        """Model readiness as Triton's `ModelIsReady`: READY in the registry, and the model's own
        readiness check (a python model's `is_ready()`) passes in every process hosting it."""
        try:
            spec, resolved = self.registry.resolve(name, version)
        except ShoalError:
            return False
        if spec.platform == "ensemble" or spec.backend in NO_USER_CHECK:
            return True
        ready, message = await self.hosted.check(self.registry.identity(name), resolved)
        if not ready:
            log.debug("Model '%s' version %d is not ready: %s", name, resolved, message)
        return ready

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        spec, resolved = self.registry.resolve(name, version)
        versions = [str(resolved)] if version else [str(v) for v in self.registry.ready_versions(name)]
        lead = [-1] if spec.max_batch_size > 0 else []

        def io(tensors: Iterable[TensorSpec]) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": t.datatype, "shape": lead + list(t.dims)} for t in tensors]

        return {
            "name": name,
            "versions": versions,
            "platform": spec.metadata_platform,
            "inputs": io(spec.inputs),
            "outputs": io(spec.outputs),
        }

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        """The normalized config, as Triton's ModelConfig message in JSON form."""
        spec, _ = self.registry.resolve(name, version)
        return spec.config

    # -- statistics -------------------------------------------------------------------------
    async def statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        """The statistics extension's `model_stats`: every ready version, or those asked for."""
        if name:
            if not self.registry.ready_versions(name):
                raise invalid(f"requested model '{name}' is not available")
            if version and int(version) not in self.registry.ready_versions(name):
                raise invalid(f"requested model version is not available for model '{name}'")
        stats = await scheduler_stats(self.nc)
        models = [self.registry.identity(name)] if name else sorted(self.registry.records)
        entries = model_entries(stats, models, self.registry.ready_versions, version)
        for entry in entries:  # with --model-namespacing: named as clients name it, as Triton does
            record = self.registry.records.get(entry.name)
            if record is not None and record.namespace:
                entry.name = record.model_name
        return entries

    # -- model repository ---------------------------------------------------------------------
    async def repository_index(self, ready: bool | None = None) -> list[dict[str, Any]]:
        """Every model the repository knows (`ready`: only READY ones; None: as Triton without a body)."""
        payload = b"" if ready is None else msgspec.json.encode(IndexRequest(ready))
        try:
            reply = await self.nc.request(subjects.REPOSITORY_INDEX, payload, timeout=10)
        except Exception as exc:
            raise unavailable(f"the repository service is not available: {type(exc).__name__}") from None
        try:
            index = msgspec.json.decode(reply.data, type=RepositoryIndex)
        except msgspec.DecodeError as exc:  # an error reply, or a repository of another version
            raise unavailable(f"the repository service answered something unreadable: {exc}") from None
        entries: list[dict[str, Any]] = msgspec.to_builtins(index.models)  # Triton's JSON document
        return entries

    async def load(self, name: str, parameters: dict[str, Any]) -> None:
        """Load or reload; `parameters`: `config` (JSON text) and `file:<path>` (base64 contents)."""
        await self._repository(subjects.REPOSITORY_LOAD, LoadRequest(name, parameters))

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        await self._repository(subjects.REPOSITORY_UNLOAD, UnloadRequest(name, unload_dependents))

    async def _repository(self, subject: str, request: RepositoryRequest) -> None:
        revision = await repository_call(self.nc, subject, request, self.repository_timeout_s)
        # answer only once this gateway sees the change, so the client's next call does too
        await self.registry.seen(revision)

    # -- trace and logging extensions --------------------------------------------------------
    def trace_settings(self, model: str = "", update: dict[str, Any] | None = None) -> dict[str, Any]:
        """The (global or a model's) trace settings, after applying `update` when given."""
        if model and not self.registry.ready_versions(model):
            raise invalid(f"Request for unknown model : {model}")
        if update is not None:
            settings = self.tracer.update_model(model, update) if model else self.tracer.update_global(update)
        else:
            settings = self.tracer.for_model(model) if model else self.tracer.settings
        return settings.json()

    async def logging(self, update: Any = None) -> dict[str, Any]:
        if update is not None:
            self.log_settings = logsettings.update(self.log_settings, update)
            # every service (this gateway included) applies it from the bus
            await self.nc.publish(subjects.LOGGING, msgspec.json.encode(self.log_settings))
        return msgspec.structs.asdict(self.log_settings)

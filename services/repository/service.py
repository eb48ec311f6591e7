"""The repository service: scans the model repository and is the single writer of model states.

It publishes one `ModelRecord` per model in the `shoal-models` KV bucket (normalized
config + per-version state). Workers load what is published and report their
instances in `shoal-instances`; from those reports this service derives each
version's state: READY once any instance is ready, UNAVAILABLE with the backend's
reason when every worker failed, LOADING until then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import msgspec
from nats.aio.client import Client as NATS

from services.repository.scan import list_models, scan_model
from shared import bus, model_config, subjects
from shared.liveness import WorkerLiveness
from shared.messages import InstanceRecord, ModelRecord, ModelVersionState, encode
from shared.runtime import serve_until
from shared.settings import RepositorySettings

log = logging.getLogger("shoal.repository")

_instance_decoder = msgspec.msgpack.Decoder(InstanceRecord)


def derive_state(reports: list[InstanceRecord], generation: int) -> ModelVersionState:
    current = [r for r in reports if r.generation == generation]
    if any(r.state == "READY" for r in current):
        return ModelVersionState("READY")
    failed = [r for r in current if r.state == "UNAVAILABLE"]
    if current and len(failed) == len(current):
        return ModelVersionState("UNAVAILABLE", failed[0].reason)
    return ModelVersionState("LOADING")


class RepositoryService:
    def __init__(self, settings: RepositorySettings, nc: NATS) -> None:
        self.settings = settings
        self.nc = nc
        self.root = Path(settings.model_repository)
        self.records: dict[str, ModelRecord] = {}
        self.reports: dict[str, InstanceRecord] = {}  # instance key -> report
        self.liveness = WorkerLiveness(nc, 5.0, self._worker_gone)
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        self.models_kv = await bus.bucket(self.nc, subjects.MODELS_BUCKET)
        self.instances_kv = await bus.bucket(self.nc, subjects.INSTANCES_BUCKET)
        for key in await self._keys(self.models_kv):  # a previous run's records
            await self.models_kv.delete(key)
        for name in self._initial_models():
            await self.load(name)
        await self.nc.subscribe(subjects.REPOSITORY_INDEX, cb=self._on_index)
        await self.liveness.start()
        self._tasks.append(asyncio.create_task(self._watch_instances()))
        log.info("repository %s: %d model(s) published", self.root, len(self.records))

    async def stop(self) -> None:
        self.liveness.stop()
        for task in self._tasks:
            task.cancel()

    @staticmethod
    async def _keys(kv) -> list[str]:
        try:
            return await kv.keys()
        except Exception:  # nats raises NoKeysError on an empty bucket
            return []

    def _initial_models(self) -> list[str]:
        available = list_models(self.root)
        if self.settings.model_control_mode != "explicit":
            return available
        wanted = self.settings.load_model
        if "*" in wanted:
            return available
        return [m for m in wanted if m in available]

    async def load(self, name: str) -> ModelRecord:
        scanned = scan_model(self.root / name, auto_complete=not (
            self.settings.disable_auto_complete_config or self.settings.strict_model_config))
        previous = self.records.get(name)
        generation = (previous.generation + 1) if previous else 1
        if scanned.config is None:
            log.error("failed to load '%s': %s", name, scanned.error)
            versions = {str(v): ModelVersionState("UNAVAILABLE", scanned.error) for v in scanned.versions or [1]}
            record = ModelRecord(name, str(scanned.path), {}, versions, generation, scanned.error)
        else:
            config = model_config.to_json(scanned.config)
            versions = {str(v): ModelVersionState("LOADING") for v in scanned.versions}
            record = ModelRecord(name, str(scanned.path), config, versions, generation)
            if not versions:
                record.reason = f"no version is available for model '{name}'"
        self.records[name] = record
        await self._publish(record)
        return record

    async def _publish(self, record: ModelRecord) -> None:
        await self.models_kv.put(subjects.model_key(record.name), encode(record))

    async def _watch_instances(self) -> None:
        async for key, value in bus.watch(self.instances_kv):
            if value is None:
                report = self.reports.pop(key, None)
            else:
                report = self.reports[key] = _instance_decoder.decode(value)
                self.liveness.seen.setdefault(report.worker, time.monotonic())
            if report is not None:
                await self._refresh(report.model)

    async def _refresh(self, name: str) -> None:
        record = self.records.get(name)
        if record is None or record.reason:
            return
        changed = False
        for version, old in record.versions.items():
            reports = [r for r in self.reports.values() if r.model == name and str(r.version) == version]
            new = derive_state(reports, record.generation)
            if new != old:
                record.versions[version] = new
                changed = True
                log.info("model '%s' version %s: %s %s", name, version, new.state, new.reason)
        if changed:
            await self._publish(record)

    async def _worker_gone(self, worker: str) -> None:
        """A worker that stopped beating (crashed, partitioned) no longer counts as an instance."""
        log.warning("worker %s stopped sending heartbeats; dropping its instances", worker)
        for key in [k for k, r in self.reports.items() if r.worker == worker]:
            await self.instances_kv.delete(key)

    def index(self, ready_only: bool = False) -> list[dict]:
        entries: list[dict] = []
        for name in list_models(self.root):
            record = self.records.get(name)
            if record is None:
                if not ready_only:
                    entries.append({"name": name})
                continue
            for version, state in sorted(record.versions.items(), key=lambda kv: int(kv[0])):
                if ready_only and state.state != "READY":
                    continue
                entry = {"name": name, "version": version, "state": state.state}
                if state.reason:
                    entry["reason"] = state.reason
                entries.append(entry)
        return entries

    async def _on_index(self, msg) -> None:
        ready_only = False
        if msg.data:
            try:
                ready_only = bool(msgspec.json.decode(msg.data).get("ready", False))
            except (msgspec.DecodeError, AttributeError):
                pass
        await msg.respond(msgspec.json.encode(self.index(ready_only)))


async def run(settings: RepositorySettings, stop: asyncio.Event) -> None:
    if not settings.model_repository or not Path(settings.model_repository).is_dir():
        raise SystemExit(f"model repository '{settings.model_repository}' is not a directory")
    nc = await bus.connect(settings.nats_url, "shoal-repository")
    await serve_until(stop, nc, RepositoryService(settings, nc))

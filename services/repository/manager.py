"""Model lifecycle: what is loaded, at which generation, and each version's state.

The manager is the single writer of `ModelRecord`s. Workers host what a record says
and report their instances; from the reports the manager derives the state clients
see. A reload publishes a new generation while the old instances keep serving, so
clients see no errors; an unload first drains the schedulers, then frees instances.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Protocol

from services.repository import ensembles, instance_groups, model_states, namespaces, polling
from services.repository.generations import next_record
from services.repository.index import index
from services.repository.model_reading import ModelReader
from services.repository.repositories import Repositories, Scan
from services.repository.reruns import Reruns
from services.repository.scan import ScannedModel, signature
from shared.errors import ShoalError, internal, invalid
from shared.process import cache_dirs
from shared.process.settings import RepositorySettings
from shared.wire.control import RepositoryIndex
from shared.wire.records import InstanceRecord, ModelFile, ModelRecord

log = logging.getLogger("shoal.repository")

Publish = Callable[[ModelRecord], Awaitable[None]]
Forget = Callable[[str], Awaitable[None]]
Drain = Callable[[str, int], Awaitable[None]]


class Files(Protocol):
    """Where a model version's files go for the workers (`publishing.FilePublisher`: NATS)."""

    async def publish(self, model_dir: Path, versions: Iterable[int]) -> list[ModelFile]: ...


class ModelManager:
    """Models are known by their identity (`shared.wire.records.model_key`; `to_load` maps names to them)."""

    def __init__(
        self,
        settings: RepositorySettings,
        publish: Publish,
        forget: Forget,
        drain: Drain,
        files: Files | None = None,
        repositories: Repositories | None = None,
    ) -> None:
        self.settings = settings
        self.files = files  # None: workers read the files at the record's path (--model-files=path)
        self.repositories = repositories or Repositories.open(
            settings.model_repository, cache_dirs.repository_mirrors(), settings.model_namespacing
        )
        self.reader = ModelReader(settings, self.repositories)
        self.publish = publish
        self.forget = forget
        self.drain = drain
        self.records: dict[str, ModelRecord] = {}
        self.reports: dict[str, InstanceRecord] = {}  # instance key -> report
        self._whole_groups: dict[instance_groups.GroupKey, int] = {}  # instance processes' groups: served whole
        self.signatures: dict[str, str] = {}
        self._failures: dict[str, str] = {}  # model -> why its last reload failed
        self.pulled: dict[str, list[str]] = {}  # ensemble -> the members its explicit load started
        self.changed = asyncio.Condition()
        self._locks: dict[str, asyncio.Lock] = {}
        self._polling = asyncio.Lock()
        self._refreshing = Reruns()  # ensembles' refreshes (nested ensembles naming each other too)

    def lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def scan(self) -> Scan:
        return self.repositories.scan()

    def available(self) -> list[str]:
        return sorted(self.scan().models)  # the identities of the models the repositories hold

    def to_load(self, name: str, files: bool = False) -> list[str]:
        """The models a load of the client's `name` loads: with namespacing, every repository's
        (as Triton); an override with files is no repository's. One found nowhere fails in `load`."""
        return [name] if files else [found.key for found in self.repositories.named(name)] or [name]

    def to_unload(self, name: str) -> list[str]:
        """The models an unload of the client's `name` unloads: every loaded model of that name."""
        return [key for key, record in self.records.items() if record.model_name == name] or [name]

    async def sync(self, name: str | None) -> None:  # the buckets' mirrors (remote.py): all, or one model's part
        await asyncio.to_thread(self.repositories.sync, name)

    # -- load -------------------------------------------------------------------
    def overridden(self) -> set[str]:
        """The models loaded from a client's files."""
        return set(self.reader.override_dirs)

    def remove_override_dirs(self) -> None:
        """At stop (model_reading.py)."""
        self.reader.remove_override_dirs()

    @property
    def on_demand(self) -> bool:
        return self.settings.model_control_mode == "on-demand"

    async def announce(self) -> None:
        """On-demand mode: every model of the repository not known yet gets a record with nothing
        loaded, which tells gateways that a request for it loads it."""
        for name, found in self.scan().models.items():
            if name not in self.records:
                self.records[name] = ModelRecord(name, str(found.path), on_demand=True, namespace=found.namespace)
                await self.publish(self.records[name])

    async def load(
        self, name: str, config: str = "", files: dict[str, str] | None = None, workers: list[str] | None = None
    ) -> ModelRecord:
        """Publish a new generation of `name`; old instances keep serving until it is ready.
        `workers`: only those host it (on-demand placement); none: every worker."""
        namespace, model = self.repositories.split(name)
        if self.repositories.remote and not files:  # a cloud repository: the model as the bucket has it now
            try:
                await self.sync(model)
            except Exception as exc:
                raise internal(f"failed to load '{model}', failed to poll from model repository: {exc}") from None
        # reading configs and ONNX files takes time: off the event loop
        scanned, labels = await asyncio.to_thread(self.reader.read, name, config, files or {}, self.records)
        if not files and scanned.path.is_dir():
            self.signatures[name] = await asyncio.to_thread(signature, scanned.path)
        # raises when the new config failed and the previous one serves: it keeps serving
        record = next_record(name, scanned, labels, self.records.get(name), list(workers or []), self.on_demand)
        record.namespace = "" if files else namespace
        if self.files is not None and record.hosted and not ensembles.record_is_ensemble(record):
            try:
                record.files = await self.files.publish(scanned.path, record.hosted)
            except Exception as exc:  # the object store is full or away: a load failure like any other
                log.exception("the files of '%s' could not be published", name)
                why = f"its files could not be published to NATS: {exc or type(exc).__name__}"
                failed = ScannedModel(scanned.name, scanned.path, None, scanned.versions, why)
                record = next_record(name, failed, {}, self.records.get(name), list(workers or []), self.on_demand)
                scanned = failed
        if scanned.config is None:
            log.error("failed to load '%s': %s", name, scanned.error)
        self.records[name] = record
        await self.publish(record)
        if ensembles.record_is_ensemble(record) and record.hosted:
            await self._load_members(record)
            await self.refresh(name)
        await self._refresh_dependents(name)
        return record

    async def _load_members(self, record: ModelRecord) -> None:
        """Explicit mode: loading an ensemble loads the composing models not loaded yet (Triton's
        rule, by name: with namespacing, those of every repository); in the other modes every model
        of the repository loads anyway."""
        if self.settings.model_control_mode != "explicit":
            return
        available = set(self.available())
        self.pulled[record.name] = []
        for member in [key for name in ensembles.member_names(record) for key in self.to_load(name)]:
            if member not in available:
                continue
            # under the member's lock, looked at again: two ensembles loading at once (every
            # repository's, with namespacing) would otherwise both load it, as one generation
            async with self.lock(member):
                current = self.records.get(member)
                if current is not None and current.hosted:
                    continue
                self.pulled[record.name].append(member)
                try:
                    await self.load(member)
                except ShoalError as exc:  # the ensemble shows the member's failure as its reason
                    log.error("%s", exc.message.strip())

    async def _refresh_dependents(self, name: str) -> None:
        for dependent in ensembles.dependents(name, self.records):
            if dependent != name:
                await self.refresh(dependent)

    def settled(self, name: str) -> bool:
        """Every live worker has finished trying the record's generation (or none reported)."""
        record = self.records.get(name)
        if record is None or record.reason:
            return True
        if ensembles.record_is_ensemble(record):
            return model_states.settled(record.versions.values())
        return all(model_states.reports_settled(self._reports(name, v), record.generation) for v in record.hosted)

    async def wait_settled(self, names: list[str], timeout: float) -> None:
        """Return once each of `names` has settled, READY or failed (or at the deadline): a load
        answers once every model it started has, as Triton's (`LoadModelByDependency`)."""
        deadline = time.monotonic() + timeout
        async with self.changed:
            while not all(self.settled(name) for name in names):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                try:
                    await asyncio.wait_for(self.changed.wait(), remaining)
                except asyncio.TimeoutError:
                    pass

    async def wait_loaded(self, name: str, generation: int, timeout: float) -> None:
        """Return once `generation` serves; raise with the backend's reason otherwise."""
        deadline = time.monotonic() + timeout
        async with self.changed:
            while self.records[name].generation == generation and not self.settled(name):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise internal(
                        f"load failed for model '{name}': timed out after {timeout:.0f}s waiting for a worker"
                    )
                try:
                    await asyncio.wait_for(self.changed.wait(), remaining)
                except asyncio.TimeoutError:
                    pass
        record = self.records[name]
        if record.reason:
            raise invalid(f"load failed for model '{name}': {record.reason}\n")
        if record.generation != generation:  # reverted to the version still serving
            raise invalid(f"load failed for model '{name}': {self._failures.get(name, 'the new version failed')}\n")
        if ensembles.record_is_ensemble(record):
            failed = model_states.first_failure(record.versions.values())
            if failed is not None:
                raise invalid(f"load failed for model '{name}': {failed}\n")
            return
        for version in record.hosted:
            reports = self._reports(name, version)
            if not any(r.serving_generation == record.generation for r in reports):
                reason = next((r.reason for r in reports if r.reason), "no instance could be created")
                raise invalid(f"load failed for model '{name}': {reason}\n")

    # -- unload ------------------------------------------------------------------
    async def unload(self, name: str) -> None:
        record = self.records.get(name)
        if record is None or not record.hosted:
            return
        record.versions.update(model_states.unloading(record.hosted))
        await self.publish(record)  # gateways stop routing new requests to it
        for version in record.hosted:
            await self.drain(name, version)  # queued and running requests finish first
        record.versions.update(model_states.unloaded(record.hosted))
        record.hosted = []
        record.serving_config, record.serving_path, record.serving_files = {}, "", []
        record.files = []  # nothing hosted: the object store may let its files go
        await self.publish(record)
        self.reader.unloaded(name)
        for key in [k for k in self._whole_groups if k[1] == name]:
            del self._whole_groups[key]
        log.info("unloaded '%s'", name)
        await self._refresh_dependents(name)

    # -- reports from workers ------------------------------------------------------
    def _reports(self, name: str, version: int) -> list[InstanceRecord]:
        """The version's reports, the instance processes of one model on one worker as one report
        (instance_groups.py)."""
        return instance_groups.fold(
            (r for r in self.reports.values() if r.model == name and r.version == version), self._whole_groups
        )

    async def on_report(self, key: str, report: InstanceRecord | None) -> None:
        # under the condition's lock: a load waiting in `wait_loaded` must not see the report
        # (settled) before the record and its dependent ensembles are published (it would answer
        # the client with a revision where an ensemble of this model is still LOADING)
        async with self.changed:
            previous = self.reports.pop(key, None)
            if report is not None:
                self.reports[key] = report
            changed = report or previous
            if changed is not None:
                await self.refresh(changed.model)
            self.changed.notify_all()

    async def refresh(self, name: str) -> None:
        record = self.records.get(name)
        if record is None or record.reason:
            return
        if ensembles.record_is_ensemble(record):
            await self._refresh_ensemble(record)
            return
        changed = False
        for version in record.hosted:
            old = record.versions.get(str(version), model_states.LOADING)
            new = model_states.follow(
                old, model_states.from_reports(self._reports(name, version), record.generation, old)
            )
            if new != old:
                record.versions[str(version)] = new
                changed = True
                log.info("model '%s' version %d: %s %s", name, version, new.state, new.reason)
        if record.serving_config and self.settled(name):
            if all(
                any(r.serving_generation == record.generation for r in self._reports(name, v)) for v in record.hosted
            ):
                # the new generation serves: its config is the one
                record.serving_config, record.serving_path, record.serving_files = {}, "", []
                self.reader.drop_stale_dirs(name)
            else:
                # the reload failed: the old generation keeps serving, and workers that join
                # later must load it, not the failed one, so it becomes the current generation
                reasons = [r.reason for v in record.hosted for r in self._reports(name, v) if r.reason]
                self._failures[name] = reasons[0] if reasons else "the new version failed to load"
                log.error("reload of '%s' failed (%s); the previous version keeps serving", name, self._failures[name])
                record.config, record.path = record.serving_config, record.serving_path or record.path
                record.files = record.serving_files or record.files
                record.serving_config, record.serving_path, record.serving_files = {}, "", []
                record.generation += 1
            changed = True
        if changed:
            await self.publish(record)
            await self._refresh_dependents(name)

    async def _refresh_ensemble(self, record: ModelRecord) -> None:
        """An ensemble follows its members: READY when they all are, UNAVAILABLE (why) when not.
        Never two at once for one ensemble, and one asked for meanwhile runs after (reruns.py)."""
        await self._refreshing.run(record.name, lambda: self._derive_ensemble(record))

    async def _derive_ensemble(self, record: ModelRecord) -> None:
        changed, unresolved = False, list[str]()
        if self.repositories.namespacing:  # its steps find their models again (one may have gone, or come back)
            changed, unresolved = namespaces.reconnect(record, self.scan(), self.records)
        derived = model_states.ensemble(record, self.records, set(self.available()))
        if unresolved:  # Triton's dependency graph: not connected
            derived = model_states.not_connected(record.name, unresolved)
        for version in record.hosted:
            old = record.versions.get(str(version))
            new = model_states.follow(old, derived)
            if new != old:
                record.versions[str(version)] = new
                changed = True
                log.info("ensemble '%s' version %d: %s %s", record.name, version, new.state, new.reason)
        if changed:  # an unchanged state ends the refreshes (nested ensembles naming each other too)
            await self.publish(record)
            await self._refresh_dependents(record.name)

    # -- the index -------------------------------------------------------------------
    def index(self, ready_only: bool = False) -> RepositoryIndex:
        return index(self.records, self.scan(), self._reports, ready_only)

    # -- poll mode ---------------------------------------------------------------------
    async def poll(self) -> None:
        """Apply the repository's changes (polling.py); one pass at a time."""
        async with self._polling:
            await polling.poll_once(self)

    async def remove(self, name: str) -> None:
        """A model gone from the repositories: unloaded if it was loaded, then forgotten."""
        if self.records[name].hosted:
            log.info("repository change: '%s' removed, unloading", name)
            async with self.lock(name):
                await self.unload(name)
        self.records.pop(name, None)
        self.signatures.pop(name, None)
        await self.forget(name)
        await self._refresh_dependents(name)

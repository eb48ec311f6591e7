"""The gateway's view of the models: the repository's published records, watched live."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import msgspec
from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue

from shared.bus import buckets
from shared.bus.revisions import CATCH_UP_S, Revisions
from shared.config.ensemble_graph import is_decoupled, is_ensemble
from shared.config.model_config import ModelSpec, spec_from_json
from shared.errors import ShoalError, invalid, not_found, unavailable
from shared.wire import subjects
from shared.wire.records import UNLOADED, ModelRecord, ModelState, model_key

log = logging.getLogger("shoal.gateway")
_record_decoder = msgspec.msgpack.Decoder(ModelRecord)


class ModelRegistry:
    def __init__(self) -> None:
        self.records: dict[str, ModelRecord] = {}
        self.specs: dict[str, ModelSpec] = {}
        self.synced = asyncio.Event()
        self.revisions = Revisions()
        self.kv: KeyValue | None = None  # the models bucket this view follows
        self._task: asyncio.Task[None] | None = None
        self._ready: dict[str, tuple[int, ...]] = {}  # name -> READY versions, until a record changes
        # --model-namespacing: a client's name -> the identities (`<repository>::<name>`) of that name
        self._named: dict[str, set[str]] = {}

    async def start(self, nc: NATS) -> None:
        self.kv = await buckets.bucket(nc, subjects.MODELS_BUCKET, create=False)  # the repository's
        self._task = asyncio.create_task(self._watch(nc, self.kv))

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()

    async def _watch(self, nc: NATS, kv: KeyValue) -> None:
        async for change in buckets.watch(nc, kv):
            if change.key:
                self.apply(subjects.untoken(change.key), change.value, change.revision)
            self.synced.set()

    async def caught_up(self, timeout: float = CATCH_UP_S) -> bool:
        """Whether this view moved on after waiting (briefly) for the bucket's newest revision: a
        request for a model it does not know asks before its answer is "no such model", since the
        model may have been loaded a moment ago by another process (a PyTriton script, a python
        model, another gateway's client) whose record this watch has not delivered yet."""
        return self.kv is not None and await self.revisions.catch_up(self.kv, timeout)

    def apply(self, name: str, value: bytes | None, revision: int) -> None:
        """The watch's record of `name` at `revision` (None: deleted)."""
        self._apply(name, value)
        self.revisions.advance(revision)

    def _apply(self, name: str, value: bytes | None) -> None:
        self._ready.clear()
        record = _record_decoder.decode(value) if value is not None else None
        previous = self.records.pop(name, None)
        if previous is not None and previous.namespace:
            self._named.get(previous.model_name, set()).discard(name)
        if record is not None:
            self.records[name] = record
            if record.namespace:
                self._named.setdefault(record.model_name, set()).add(name)
        if record is not None and record.active_config:  # during a reload: the instances still serving
            self.specs[name] = spec_from_json(record.active_config, name)
        else:
            self.specs.pop(name, None)
        self._derive_decoupled()

    def _derive_decoupled(self) -> None:
        """An ensemble with a decoupled step is decoupled itself (its responses stream): `/infer`
        refuses it and `/generate_stream` streams it. Derived here from the members' configs, not
        written into the ensemble's config, because a member can be reloaded (decoupled or not)
        without the ensemble being touched; any record change re-derives every ensemble."""
        configs = {name: spec.config for name, spec in self.specs.items()}
        for name, spec in list(self.specs.items()):
            if is_ensemble(spec.config):
                decoupled = is_decoupled(name, configs)
                if decoupled != spec.decoupled:
                    self.specs[name] = dataclasses.replace(spec, decoupled=decoupled)

    async def seen(self, revision: int, timeout: float = 10.0) -> bool:
        """Wait until this gateway has every record up to the repository's KV `revision`; whether it has."""
        return await self.revisions.seen(revision, timeout)

    def identity(self, name: str) -> str:
        """The model a client's `name` addresses: itself, or with namespacing the one model of that
        name (core's `FindModelIdentifier`; several: Triton's error)."""
        if name in self.records or not self._named.get(name):
            return name
        found = self._named[name]
        if len(found) > 1:
            raise invalid(
                f"There are {len(found)} identifiers of model '{name}' in global map, model namespace must be "
                "provided to resolve ambiguity."
            )
        return next(iter(found))

    def ready_versions(self, name: str) -> tuple[int, ...]:
        """The model's READY versions, oldest first (kept until a record changes: every request asks)."""
        ready = self._ready.get(name)
        if ready is None:
            try:
                name = self.identity(name)
            except ShoalError:
                return ()
            record = self.records.get(name)
            if record is None:  # not kept: clients may ask for any name
                return ()
            ready = self._ready[name] = tuple(
                sorted(int(v) for v, s in record.versions.items() if s.state == ModelState.READY)
            )
        return ready

    def resolve(self, name: str, version: str = "") -> tuple[ModelSpec, int]:
        """The model and version a request goes to, or Triton's error for why not."""
        key = self.identity(name)
        record = self.records.get(key)
        if record is None:
            raise not_found(f"Request for unknown model: '{name}' is not found")
        if not version:
            ready = self.ready_versions(key)
            if not ready or key not in self.specs:
                raise not_found(f"Request for unknown model: '{name}' has no available versions")
            return self.specs[key], ready[-1]
        state = record.versions.get(str(int(version)))
        if state is None:
            raise not_found(f"Request for unknown model: '{name}' version {int(version)} is not found")
        if state.state != ModelState.READY or key not in self.specs:
            raise unavailable(f"Request for unknown model: '{name}' version {int(version)} is not at ready state")
        return self.specs[key], int(version)

    def labels(self, name: str, output: str, depth: int = 0) -> list[str] | None:
        """The classification labels of a model's output: its own `label_filename`, or for an
        ensemble's output without one, the labels of the step's model that produces it (Triton's
        core completes an ensemble's label provider so: `model_lifecycle.cc`)."""
        record = self.records.get(name)
        if record is None or depth > 16:  # an ensemble graph is acyclic; the bound is a guard
            return None
        own = record.labels.get(output)
        if own is not None or not is_ensemble(record.active_config):
            return own
        for step in record.active_config.get("ensemble_scheduling", {}).get("step", []):
            for member_output, tensor in step.get("output_map", {}).items():
                if tensor == output:
                    member = model_key(step.get("model_namespace", ""), step["model_name"])
                    return self.labels(member, member_output, depth + 1)
        return None

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            self.resolve(name, version)
        except ShoalError:
            return False
        return True

    def settled(self, name: str) -> bool:
        """Whether a load of `name` is over: no version LOADING (READY, failed, or no record: gone)."""
        record = self.records.get(name)
        return record is None or not record.any_version(ModelState.LOADING)

    def all_ready(self) -> bool:
        """Strict readiness: every version the repository tried to load is READY."""
        return all(
            s.state == ModelState.READY or s.reason == UNLOADED
            for record in self.records.values()
            for s in record.versions.values()
        )

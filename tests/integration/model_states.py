"""Every state the models bucket publishes, watched from a connection of its own: a poll of the
index could miss a short flap (READY, UNAVAILABLE, READY within a second)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import msgspec
import nats

from shared.wire import subjects
from shared.wire.records import InstanceRecord, ModelRecord


class StateLog:
    """Every state the models bucket published for each model version, in order, and which workers
    serve each version now (the instances bucket), from watches on a connection of their own (a
    poll of the index could miss a short flap)."""

    def __init__(self, nats_url: str) -> None:
        self.nats_url = nats_url
        self.states: dict[str, list[str]] = {}
        self.reports: dict[str, InstanceRecord] = {}  # instance key -> the worker's report
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._watch()), daemon=True)

    def __enter__(self) -> StateLog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def serving(self, model: str, version: int = 1) -> set[str]:
        """The workers whose instances of the version serve now."""
        reports = list(self.reports.values())
        return {r.worker for r in reports if r.model == model and r.version == version and r.serving_generation}

    async def _watch(self) -> None:
        nc = await nats.connect(self.nats_url)
        try:
            await asyncio.gather(
                self._watch_bucket(nc, subjects.MODELS_BUCKET, self._on_model),
                self._watch_bucket(nc, subjects.INSTANCES_BUCKET, self._on_instance),
            )
        finally:
            await nc.close()

    async def _watch_bucket(self, nc: nats.NATS, bucket: str, apply: Callable[[str, bytes], None]) -> None:
        while True:  # the repository makes the buckets when it starts
            try:
                kv = await nc.jetstream().key_value(bucket)
                break
            except Exception:
                if self._stop.is_set():
                    return
                await asyncio.sleep(0.1)
        watcher = await kv.watchall()
        while not self._stop.is_set():
            try:
                entry = await watcher.updates(timeout=0.2)
            except (asyncio.TimeoutError, nats.errors.TimeoutError):
                continue
            if entry is not None and entry.key:
                apply(entry.key, entry.value or b"")

    def _on_model(self, key: str, value: bytes) -> None:
        if not value:
            return
        record = msgspec.msgpack.decode(value, type=ModelRecord)
        for version, state in record.versions.items():
            seen = self.states.setdefault(f"{record.name}/{version}", [])
            if not seen or seen[-1] != state.state:
                seen.append(state.state)

    def _on_instance(self, key: str, value: bytes) -> None:
        if value:
            self.reports[key] = msgspec.msgpack.decode(value, type=InstanceRecord)
        else:
            self.reports.pop(key, None)

    def flapped(self) -> dict[str, list[str]]:
        """Model versions that left READY after reaching it."""
        return {
            key: states
            for key, states in self.states.items()
            if "READY" in states and any(s != "READY" for s in states[states.index("READY") :])
        }

"""What a worker reports when the process of one of its python models dies (see isolation.py).

A child that dies *while loading* its model fails the load, as Triton fails a load whose stub
died: the parent writes an UNAVAILABLE report under its own id (it stays alive to keep it)
and does not restart the child until the next load. A child that dies later is restarted.
Either way the dead incarnation's own reports are deleted at once, so the repository does not
take its instances for live ones until the heartbeat timeout.

Its reports are what tell the two deaths apart, so a failure to read them (the bus busy or away)
is retried for a while: read as "no reports", a deliberate crash of a model that had loaded
within `QUICK_DEATH_S` was taken for a death while loading, and the model was never restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import msgspec
from nats.js.errors import KeyDeletedError, KeyNotFoundError
from nats.js.kv import KeyValue

from shared.bus import buckets
from shared.wire import subjects
from shared.wire.messages import encode
from shared.wire.records import InstanceRecord, ModelRecord, ModelState

log = logging.getLogger("shoal.worker")

QUICK_DEATH_S = 10.0  # a child that said nothing and died this soon died starting or loading
READ_REPORTS_S = 10.0  # how long to retry reading a dead child's reports before judging without them


class ChildReports:
    def __init__(self, kv: KeyValue, parent_id: str) -> None:
        self.kv = kv
        self.parent_id = parent_id
        self.failed: set[tuple[str, int]] = set()  # (model, version) with a load failure reported by us

    async def crashed(
        self, record: ModelRecord, child_id: str, code: int, lived_s: float, group: tuple[str, int] | None = None
    ) -> bool:
        """Record the death of `child_id`'s last incarnation; True if it died loading the model.
        `group`: the process of one instance, (its model's group, the group's size): the failure is
        reported as one of the group's, so that the model's load fails."""
        reports = await self._read_reports(child_id, record.name)
        loading = False
        for version in record.hosted:
            mine = [(revision, report) for key, revision, report in reports if report.version == version]
            last = max(mine, key=lambda item: item[0])[1] if mine else None
            if last is None:
                died_loading = lived_s < QUICK_DEATH_S
            else:
                died_loading = last.state == ModelState.LOADING and last.generation == record.generation
            if died_loading:
                loading = True
                await self._fail(
                    record,
                    version,
                    f"the process of python model '{record.name}' exited with code {code} while loading it",
                    group,
                )
        for key, _, _ in reports:  # that incarnation serves nothing any more
            with contextlib.suppress(Exception):
                await self.kv.delete(key)
        return loading

    async def forget(self, model: str, versions: list[int]) -> None:
        """A new load (or an unload) of the model: our failure reports of it go."""
        keys = {(model, v) for v in versions} | {k for k in self.failed if k[0] == model}
        for key in keys:
            self.failed.discard(key)
            with contextlib.suppress(Exception):
                await self.kv.delete(subjects.instance_key(self.parent_id, *key))

    async def _fail(self, record: ModelRecord, version: int, reason: str, group: tuple[str, int] | None = None) -> None:
        self.failed.add((record.name, version))  # before the put: a cancelled put is still forgotten later
        failed = InstanceRecord(
            worker=self.parent_id,
            model=record.name,
            version=version,
            generation=record.generation,
            state=ModelState.UNAVAILABLE,
            reason=reason,
            group=group[0] if group else "",
            group_size=group[1] if group else 0,
        )
        await self.kv.put(subjects.instance_key(self.parent_id, record.name, version), encode(failed))

    async def _read_reports(self, worker_prefix: str, model: str) -> list[tuple[str, int, InstanceRecord]]:
        """`_reports_of`, retried while the bucket cannot be read, up to READ_REPORTS_S."""
        deadline = time.monotonic() + READ_REPORTS_S
        delay = 0.05
        while True:
            try:
                return await self._reports_of(worker_prefix, model)
            except Exception as exc:
                if time.monotonic() + delay > deadline:
                    log.warning("cannot read the reports of %s (%s); judging its death by its age", worker_prefix, exc)
                    return []
                log.debug("reading the reports of %s: %s; retrying", worker_prefix, exc)
            await asyncio.sleep(delay)  # a retry back-off, not a synchronisation
            delay = min(1.0, delay * 2)

    async def _reports_of(self, worker_prefix: str, model: str) -> list[tuple[str, int, InstanceRecord]]:
        """(key, KV revision, report) of every incarnation of a child (each has its own id); raises
        when the bucket cannot be read (a missing key is a report deleted meanwhile)."""
        reports = []
        for key in await buckets.list_keys(self.kv):
            if not key.startswith(worker_prefix + "-"):
                continue
            try:
                entry = await self.kv.get(key)
            except (KeyNotFoundError, KeyDeletedError):
                continue
            if entry.value is None:
                continue
            try:
                report = msgspec.msgpack.decode(entry.value, type=InstanceRecord)
            except msgspec.DecodeError:
                continue
            if report.model == model:
                reports.append((key, entry.revision or 0, report))
        return reports

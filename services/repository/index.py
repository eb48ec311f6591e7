"""The repository index (`POST /v2/repository/index`): every model of every repository and each
version's state, as Triton's `ModelRepositoryManager::RepositoryIndex` lists them.

Entries are ordered by (namespace, name) and named as clients name the models: with namespacing
two models of one name are two entries of that name (Triton's index names no repository). A name
that several repositories hold without namespacing is one entry, UNAVAILABLE, with Triton's reason.
"""

from __future__ import annotations

from collections.abc import Callable

from services.repository.repositories import DUPLICATE, Scan
from shared.wire.control import IndexEntry, RepositoryIndex
from shared.wire.records import InstanceRecord, ModelRecord, ModelState, ModelVersionState

Reports = Callable[[str, int], list[InstanceRecord]]  # (model key, version) -> its instances' reports


def index(records: dict[str, ModelRecord], scan: Scan, reports: Reports, ready_only: bool = False) -> RepositoryIndex:
    """Triton lists a duplicate even when asked for READY models only (`RepositoryIndex`)."""
    models: dict[tuple[str, str], str] = {(found.namespace, found.name): key for key, found in scan.models.items()}
    models.update({(record.namespace, record.model_name): key for key, record in records.items()})
    models.update({("", name): "" for name in scan.duplicates})
    entries: list[IndexEntry] = []
    for (_, name), key in sorted(models.items()):
        record = records.get(key) if key else None
        if not key:
            entries.append(IndexEntry(name, state=ModelState.UNAVAILABLE, reason=DUPLICATE))
        elif record is None or not record.versions:
            if not ready_only:
                entries.append(IndexEntry(name))
        else:
            for version, state in sorted(record.versions.items(), key=lambda kv: int(kv[0])):
                if not ready_only or state.state == ModelState.READY:
                    entries.append(_entry(name, key, version, state, reports))
    return RepositoryIndex(entries)


def _entry(name: str, key: str, version: str, state: ModelVersionState, reports: Reports) -> IndexEntry:
    entry = IndexEntry(name, version, state.state, state.reason)
    if state.state != ModelState.READY:
        return entry
    found = reports(key, int(version))
    warmup = [r.warmup_ms for r in found if r.warmup_ms]
    if warmup:
        entry.warmup_ms = round(max(warmup), 3)
    if any(r.rss_bytes or r.device_bytes for r in found):
        # what its instances took at load, on every worker that hosts it (shared/memory/footprint.py)
        entry.memory_bytes = sum(r.rss_bytes for r in found)
        entry.device_memory_bytes = sum(r.device_bytes for r in found)
    return entry

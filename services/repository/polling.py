"""Poll mode (`--model-control-mode=poll`): one pass over the repositories applies their changes.
New models load, removed ones unload, and changed ones (their files' signature, or the repository
they come from) reload; a failed reload keeps the old version serving (docs/models.md)."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from services.repository.repositories import Repositories
from services.repository.scan import signature
from shared.errors import ShoalError
from shared.wire.records import ModelRecord

log = logging.getLogger("shoal.repository")


class Models(Protocol):
    """What a pass needs of the model manager (manager.py)."""

    repositories: Repositories
    records: dict[str, ModelRecord]
    signatures: dict[str, str]  # model -> its files' signature at its last load

    def lock(self, name: str) -> asyncio.Lock: ...

    def overridden(self) -> set[str]: ...

    async def sync(self, name: str | None) -> None: ...

    async def load(self, name: str) -> ModelRecord: ...

    async def remove(self, name: str) -> None: ...


async def poll_once(models: Models) -> None:
    if models.repositories.remote:  # a cloud repository: its mirror first
        try:
            await models.sync(None)
        except Exception as exc:  # the bucket is away: nothing changes this round
            log.error("failed to poll from model repository %s: %s", models.repositories.describe(), exc)
            return
    located = models.repositories.scan().models
    overridden = models.overridden()  # loaded from a client's files: no repository's to follow
    for name in sorted(set(located) - overridden):
        current = await asyncio.to_thread(signature, located[name].path)
        record = models.records.get(name)  # the same files in another repository load from there
        if models.signatures.get(name) == current and record is not None and record.path == str(located[name].path):
            continue
        log.info("repository change: %s '%s'", "reloading" if name in models.records else "loading", name)
        try:
            async with models.lock(name):
                await models.load(name)
        except ShoalError as exc:  # a failed reload keeps the old version serving
            models.signatures[name] = current
            log.error("%s", exc.message.strip())
    for name in sorted(set(models.records) - set(located) - overridden):
        await models.remove(name)

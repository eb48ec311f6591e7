"""What the repository loaded at its start, as a gateway learns it: the half of readiness that
the models bucket alone cannot tell (docs/reliability.md, "Ready means ready").

A gateway's view of the models bucket says nothing about records not published yet: while the
repository still reads its models (configs, python models' `auto_complete_config`), the bucket
holds some records or none, and every record it holds may already be READY. So the gateway asks
the repository for its start-up set (`StartupSet`), which the repository answers only once every
one of those records is published, waits until its watch has the revision of the last one, and
only then can be ready: when every start-up model is READY or has failed (strict readiness also
wants every model READY, as tritonserver's `--strict-readiness`). A repository that starts again
says so first (`REPOSITORY_STARTING`): the gateway forgets the set and asks the new one.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from inference.models import ModelRegistry
from shared.wire import subjects
from shared.wire.control import StartupSet

log = logging.getLogger("shoal.gateway")

ASK_TIMEOUT_S = 2.0  # one question; a busy repository answers later: asked again
ASK_AGAIN_S = 0.1  # after "no responders": no repository yet, or one still publishing its models
_decoder = msgspec.json.Decoder(StartupSet)


class RepositoryStartup:
    def __init__(self, nc: NATS, registry: ModelRegistry) -> None:
        self.nc = nc
        self.registry = registry
        self.models: tuple[str, ...] | None = None  # None: not heard from the repository yet
        self._task: asyncio.Task[None] | None = None
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(subjects.REPOSITORY_STARTING, cb=self._on_starting)
        self._ask_again()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # the connection is closing
                pass

    def settled(self) -> bool:
        """Heard from the repository, seen what it published at start, and every start-up model
        is READY or has failed (none LOADING; one unloaded since has no record: settled too)."""
        models = self.models
        return models is not None and all(self.registry.settled(name) for name in models)

    async def _on_starting(self, msg: Msg) -> None:
        log.info("the repository is starting again: not ready until its models are published")
        self._ask_again()

    def _ask_again(self) -> None:
        self.models = None
        if self._task is not None:
            self._task.cancel()
        self._task = asyncio.create_task(self._ask())

    async def _ask(self) -> None:
        while True:
            try:
                reply = await self.nc.request(subjects.REPOSITORY_STARTED, b"", timeout=ASK_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # no repository yet (no responders), a busy one, the bus away
                log.debug("asking the repository for its start-up models: %s", type(exc).__name__)
                await asyncio.sleep(ASK_AGAIN_S)
                continue
            try:
                startup = _decoder.decode(reply.data)
            except msgspec.DecodeError:  # an error reply, or a repository of another version
                log.warning("the repository's start-up set is unreadable: %r", reply.data[:200])
                await asyncio.sleep(1.0)
                continue
            while not await self.registry.seen(startup.revision, 10.0):
                log.info("waiting for the models bucket to reach revision %d", startup.revision)
            self.models = tuple(startup.models)
            log.debug("the repository's %d start-up model(s) are published", len(self.models))
            return

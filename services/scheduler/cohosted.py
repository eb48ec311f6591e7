"""A scheduler replica inside the gateway's process: the in-process adapter over the same pump
as the bus adapter (`service.py`).

The gateway's dispatcher hands it the requests of the models whose lease it holds by a function
call (`shared.bus.dispatch.LocalScheduler`), and the workers send it each batch's completion with
the gateway's answers in one message (`BatchDone`, on the gateway's inbox). Requests of models
another replica holds still go over the bus, and this replica takes the requests other gateways
send it over the bus as any replica does. Why: docs/design.md, "Co-hosting".
"""

from __future__ import annotations

import msgspec
from nats.aio.client import Client as NATS

from services.scheduler.batching.worker_channels import WorkerChannels
from services.scheduler.service import SchedulerService
from shared.process.settings import SchedulerSettings
from shared.wire.messages import InstanceFree


class CoHosted:
    def __init__(
        self, settings: SchedulerSettings, nc: NATS, inbox: str, channels: WorkerChannels | None = None
    ) -> None:
        self._service = SchedulerService(settings, nc, local_inbox=inbox, channels=channels)

    async def start(self) -> None:
        await self._service.start()

    async def stop(self) -> None:
        await self._service.stop()

    def owns(self, model: str) -> bool:
        return self._service.owns(model)

    async def take(self, requests: list[msgspec.Raw]) -> None:
        await self._service.take(requests)

    async def completed(self, free: InstanceFree) -> None:
        await self._service.completed(free)

    def worker_suspect(self, worker: str) -> None:
        """A worker's local channel closed (docs/design.md §9)."""
        self._service.worker_suspect(worker)

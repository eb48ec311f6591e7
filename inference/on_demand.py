"""The gateway's side of models on demand: a request for a model the repository holds but has not
loaded asks the repository to load it, waits (bounded by the request's timeout), then goes on.

Requests for one model arriving together send one question; the repository shares one load
among gateways too (services/repository/demand.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.client import Client as NATS

from inference.models import ModelRegistry
from shared.bus.repository_client import repository_call
from shared.config.model_config import ModelSpec
from shared.errors import ShoalError, unavailable
from shared.wire import subjects
from shared.wire.control import DemandRequest


def request_timeout_s(parameters: dict[str, Any]) -> float | None:
    """A request's own `timeout` parameter (microseconds), in seconds; None when it has none."""
    value = parameters.get("timeout")
    return value / 1e6 if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class DemandLoads:
    def __init__(self, nc: NATS, registry: ModelRegistry, timeout_s: float) -> None:
        self.nc = nc
        self.registry = registry
        self.timeout_s = timeout_s  # a request with no timeout of its own
        self._loads: dict[str, asyncio.Task[None]] = {}

    def loads(self, name: str) -> bool:
        """Whether a request for `name` may load it (the repository runs on demand and holds it)."""
        try:
            key = self.registry.identity(name)  # with namespacing: a client's name is one model's, or none
        except ShoalError:
            return False  # several repositories hold it: the request gets Triton's ambiguity error
        record = self.registry.records.get(key)
        return record is not None and record.on_demand

    async def resolve(
        self, name: str, version: str, missing: ShoalError, timeout_s: float | None = None
    ) -> tuple[ModelSpec, int]:
        """The model and version once loaded; `missing` (why it could not be resolved) when the
        model is not one that loads on demand."""
        key = self.registry.identity(name)  # with namespacing, the one model of that name (else Triton's error)
        if not self.loads(key):
            raise missing
        timeout = timeout_s or self.timeout_s
        task = self._loads.get(key)
        if task is None:
            # shared by every request waiting for it: bounded by the longest wait any may have, so
            # that a first request with a short timeout does not cut the load short for the others
            task = self._loads[key] = asyncio.create_task(self._load(key, max(timeout, self.timeout_s)))
            task.add_done_callback(lambda done: self._loads.pop(key, None) if self._loads.get(key) is done else None)
            task.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved: never logged
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except asyncio.TimeoutError:
            raise unavailable(
                f"load failed for model '{name}': not loaded within the request's timeout ({timeout:g} s)"
            ) from None
        except ShoalError as exc:
            raise unavailable(exc.message.strip()) from None
        return self.registry.resolve(name, version)

    async def _load(self, name: str, timeout_s: float) -> None:
        revision = await repository_call(
            self.nc, subjects.REPOSITORY_DEMAND, DemandRequest(name, timeout_s), timeout_s + 1
        )
        await self.registry.seen(revision)  # its READY record, before the request is sent

"""Models on demand (`--model-control-mode=on-demand`): a request loads its model, idle models
make room for it (docs/models.md, "Models on demand").

The repository is the one place that sees every model's state and every worker's budget, so it
decides here: which worker takes a model (`eviction.place`), which least recently used idle
models leave first, and it loads one model at a time so each decision sees the sizes the
previous loads measured. Concurrent requests for one model share one load. Explicit loads,
`--load-model`, `--pin-model` globs and a config's `shoal.pinned` parameter pin a model.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from services.repository import ensembles
from services.repository.autocomplete import config_path
from services.repository.eviction import Placement, Resident, Room, place
from services.repository.manager import ModelManager
from shared.config import model_config
from shared.errors import ShoalError, not_found, unavailable
from shared.process.settings import RepositorySettings
from shared.wire.control import Eviction, ModelFigures, ModelUsage
from shared.wire.messages import WorkerHeartbeat
from shared.wire.records import ModelRecord, ModelState

log = logging.getLogger("shoal.repository")

PIN_PARAMETER = "shoal.pinned"
ROOM_RETRY_S = 0.05  # how often a load waiting for a model to become idle looks again

Usage = dict[str, ModelUsage]  # model -> its usage, merged over the scheduler replicas


@dataclass(frozen=True)
class Budget:
    """What a worker said in its last heartbeat."""

    budget_bytes: int
    max_models: int
    models: tuple[str, ...]  # its --models globs

    @classmethod
    def of(cls, beat: WorkerHeartbeat) -> Budget:
        return cls(beat.budget_bytes, beat.max_models, tuple(beat.models))

    def takes(self, name: str) -> bool:
        return not self.models or any(fnmatch.fnmatchcase(name, p) for p in self.models)


class OnDemand:
    def __init__(
        self,
        manager: ModelManager,
        settings: RepositorySettings,
        usage: Callable[[], Awaitable[Usage]],
        budgets: Callable[[], dict[str, Budget]],
    ) -> None:
        self.manager = manager
        self.settings = settings
        self.usage = usage
        self.budgets = budgets
        self.pinned: set[str] = set()  # explicit loads, until unloaded
        self.evictions: Counter[tuple[str, str]] = Counter()  # (model, reason) -> count
        self.thrash: Counter[str] = Counter()
        self.loads: Counter[str] = Counter()
        self._evicted_at: dict[str, float] = {}
        self._touched: dict[str, float] = {}  # when the repository last loaded or was asked for a model
        self._sizes: dict[str, int] = {}  # last measured size of each model
        self._ensemble: dict[str, bool] = {}
        self._protected: Counter[str] = Counter()  # members of ensembles being loaded
        self._placing = asyncio.Lock()
        self._inflight: dict[str, asyncio.Task[None]] = {}

    # -- asking ------------------------------------------------------------------------------
    async def ensure(self, name: str, timeout_s: float) -> None:
        """Return once `name` is READY; concurrent callers share one load. Raises its reason."""
        task = self._inflight.get(name)
        if task is None:
            task = asyncio.create_task(self._ensure(name, timeout_s))
            self._inflight[name] = task
            task.add_done_callback(lambda done: self._finished(name, done))
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout_s)
        except asyncio.TimeoutError:
            raise unavailable(
                f"load failed for model '{name}': not loaded within the request's timeout ({timeout_s:g} s); "
                "it goes on loading"
            ) from None

    def _finished(self, name: str, task: asyncio.Task[None]) -> None:
        if self._inflight.get(name) is task:
            del self._inflight[name]
        if not task.cancelled() and task.exception() is not None:
            log.debug("on-demand load of '%s': %s", name, task.exception())

    def loading(self) -> int:
        """On-demand loads under way: requests wait for them (with no worker, for one to come)."""
        return len(self._inflight)

    def pin(self, name: str) -> None:
        self.pinned.add(name)

    def unpin(self, name: str) -> None:
        self.pinned.discard(name)

    def ready(self, name: str) -> bool:
        record = self.manager.records.get(name)
        return record is not None and bool(record.hosted) and record.any_version(ModelState.READY)

    async def _ensure(self, name: str, timeout_s: float) -> None:
        if name not in self.manager.available():
            raise not_found(f"Request for unknown model: '{name}' is not found")
        if self.ready(name):
            return
        record = self.manager.records.get(name)
        if record is not None and record.hosted and record.any_version(ModelState.LOADING):
            await self.manager.wait_loaded(name, record.generation, self.settings.load_timeout_s)
            return  # an explicit load (or --load-model) already under way
        self._requested(name)
        if await self.is_ensemble(name):
            await self._ensure_ensemble(name, timeout_s)
            return
        deadline = time.monotonic() + timeout_s
        async with self._placing:  # one placement at a time: each sees what the last one measured
            if self.ready(name):
                return
            worker = await self._make_room(name, deadline)
            async with self.manager.lock(name):
                record = await self.manager.load(name, workers=[worker])
                self.loads[name] += 1
                self._touched[name] = time.time()
                log.info("on-demand load of '%s' on worker %s", name, worker)
                await self.manager.wait_loaded(name, record.generation, self.settings.load_timeout_s)
            self._sizes[name] = self._measured(name) or self._sizes.get(name, 0)
        await self._until_served(name, deadline)

    async def _until_served(self, name: str, deadline: float) -> None:
        """READY is the worker's word; a request sent now also needs a scheduler that took the
        model's lease and subscribed to its requests, which a busy scheduler may do after the
        worker loaded it (benchmarks/on_demand.py saw requests find no scheduler)."""
        while name not in await self.usage() and time.monotonic() < deadline:
            await asyncio.sleep(ROOM_RETRY_S)

    async def _ensure_ensemble(self, name: str, timeout_s: float) -> None:
        """Its members first (each placed like any model, and not evicted while the others
        load), then the ensemble itself, which follows them."""
        async with self.manager.lock(name):
            record = self.manager.records.get(name)
            if record is None or not record.hosted or not record.config:
                record = await self.manager.load(name)
        members = ensembles.members_of(record) if ensembles.record_is_ensemble(record) else []
        self._protected.update(members)
        try:
            for member in members:
                await self.ensure(member, timeout_s)
            async with self.manager.lock(name):
                await self.manager.refresh(name)
                record = self.manager.records[name]
                await self.manager.wait_loaded(name, record.generation, timeout_s)
        finally:
            self._protected.subtract(members)

    async def is_ensemble(self, name: str) -> bool:
        known = self._ensemble.get(name)
        if known is None:
            located = self.manager.repositories.locate(name)
            if located is None:  # in no repository, or in several: its load says why
                return False
            path = config_path(located.path, self.manager.reader.auto_complete.config_name)
            try:
                text = await asyncio.to_thread(model_config.read_text, path)
                known = model_config.parse_text(text, path).platform == "ensemble"
            except (OSError, ShoalError):
                known = False  # no config (auto-completed) or a bad one: its load says why
            self._ensemble[name] = known
        return known

    def _requested(self, name: str) -> None:
        """A model asked for again soon after it was evicted: the budget is too small for the workload."""
        now = time.time()
        self._touched[name] = now
        evicted = self._evicted_at.pop(name, None)
        if evicted is not None and now - evicted < self.settings.thrash_window_s:
            self.thrash[name] += 1
            log.warning(
                "model '%s' requested %.1f s after its eviction (thrash): the workers' budgets are too small "
                "for the models in use",
                name,
                now - evicted,
            )

    # -- room ------------------------------------------------------------------------------------
    async def _make_room(self, name: str, deadline: float) -> str:
        size = self._sizes.get(name) or self._typical_size()
        usage: Usage | None = None  # asked only when something must go
        while True:
            rooms = self.rooms(name, usage)
            if not rooms:  # none yet (just started, restarting): one may beat before the deadline
                if time.monotonic() >= deadline:
                    raise unavailable(f"load failed for model '{name}': no worker is available to load it")
                await asyncio.sleep(ROOM_RETRY_S)
                continue
            placement = place(rooms, size) if usage is not None or any(r.fits(size) for r in rooms) else None
            if placement is not None:
                await self._evict(placement)
                return placement.worker
            if usage is not None and time.monotonic() >= deadline:
                raise unavailable(
                    f"load failed for model '{name}': no worker has room for it; every model loaded is in use "
                    "or pinned (--model-memory-budget, --max-loaded-models)"
                )
            if usage is not None:
                await asyncio.sleep(ROOM_RETRY_S)  # a model in use now may be idle in a moment
            usage = await self.usage()

    def rooms(self, name: str, usage: Usage | None) -> list[Room]:
        return [
            Room(worker, budget.budget_bytes, budget.max_models, tuple(self._residents(worker, usage or {})))
            for worker, budget in sorted(self.budgets().items())
            if budget.takes(name)
        ]

    def _residents(self, worker: str, usage: Usage) -> list[Resident]:
        residents = []
        for name, record in self.manager.records.items():
            if not self._resident(record, worker):
                continue
            used = usage.get(name) or ModelUsage()
            last = max(used.last_used_ms / 1000, self._touched.get(name, 0.0))
            busy = used.busy or self._protected[name] > 0 or name in self._inflight
            size = self._measured(name) or self._sizes.get(name, 0)
            residents.append(Resident(name, size, last, busy, self.is_pinned(record)))
        return residents

    def _resident(self, record: ModelRecord, worker: str) -> bool:
        if not record.hosted or not record.config or ensembles.record_is_ensemble(record):
            return False
        if record.workers and worker not in record.workers:
            return False
        reports = [r for r in self.manager.reports.values() if r.model == record.name]
        return not reports or any(r.state != ModelState.UNAVAILABLE for r in reports)  # a failed load holds nothing

    def is_pinned(self, record: ModelRecord) -> bool:
        parameter = record.active_config.get("parameters", {}).get(PIN_PARAMETER, {})
        return (
            record.name in self.pinned
            or any(fnmatch.fnmatchcase(record.name, p) for p in self.settings.pin_model)
            or str(parameter.get("string_value", "")).lower() in ("true", "1", "yes")
        )

    def _measured(self, name: str) -> int:
        return sum(r.rss_bytes + r.device_bytes for r in self.manager.reports.values() if r.model == name)

    def _typical_size(self) -> int:
        """A model never loaded yet: assume the mean of those measured (0 before any)."""
        sizes = [s for s in self._sizes.values() if s]
        return sum(sizes) // len(sizes) if sizes else 0

    async def _evict(self, placement: Placement) -> None:
        for victim in placement.evict:
            idle = time.time() - victim.last_used
            log.warning(
                "evicting '%s' from worker %s (%s): least recently used, idle %.1f s, %.1f MiB",
                victim.name,
                placement.worker,
                placement.reason,
                idle,
                victim.size / (1 << 20),
            )
            async with self.manager.lock(victim.name):
                await self.manager.unload(victim.name)
            self.evictions[(victim.name, placement.reason)] += 1
            self._evicted_at[victim.name] = time.time()

    # -- figures -----------------------------------------------------------------------------------
    def figures(self) -> ModelFigures:
        """For /metrics: evictions, thrash, on-demand loads (the memory comes from the reports)."""
        evictions = [Eviction(m, r, n) for (m, r), n in sorted(self.evictions.items())]
        return ModelFigures(evictions=evictions, loads=dict(self.loads), thrash=dict(self.thrash))

"""The load: closed-loop concurrency or open-loop request rate, measured in windows until stable.

Each level runs like perf_analyzer's: windows of `window_ms`; after each, the window's client stats and a
statistics snapshot; stop when the last 3 windows agree within `stability_pct` (or after `max_trials`);
report the 3 last windows merged, with the server's side from the snapshots around them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from shoal.perf.inputs import Step
from shoal.perf.measure import (
    PERCENTILES,
    ClientStats,
    LevelResult,
    Record,
    client_stats,
    is_stable,
    server_delta,
)
from shoal.perf.options import PerfError, PerfOptions
from shoal.perf.transport import Transport

STABLE_WINDOWS = 3
OnWindow = Callable[[float, int, ClientStats], None]


@dataclass
class _Load:
    """The requests of one level in flight: completed records, a stop flag, the first failure."""

    records: list[Record] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    failed: asyncio.Event = field(default_factory=asyncio.Event)
    error: BaseException | None = None
    completed: int = 0

    def fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self.stop.set()
        self.failed.set()


class Engine:
    def __init__(self, transport: Transport, steps: list[Step], options: PerfOptions) -> None:
        self.transport, self.steps, self.options = transport, steps, options
        self.percentiles = tuple(sorted({*PERCENTILES, *([options.percentile] if options.percentile else [])}))

    async def run(self, on_window: OnWindow | None = None, on_level: Callable[[LevelResult], None] | None = None):
        results: list[LevelResult] = []
        for level in self.options.levels:
            result = await self.measure_level(level, on_window)
            results.append(result)
            if on_level:
                on_level(result)
            limit_us = self.options.latency_limit_ms * 1e3
            if limit_us and result.client.latency_us(self.options.percentile or 99) > limit_us:
                break
        return results

    async def _send(self, load: _Load, step: int) -> None:
        try:
            load.records.append(await self.transport.infer(step))
            load.completed += 1
        except Exception as exc:  # the first failure ends the level with the server's message
            load.fail(exc)

    async def _closed_loop(self, load: _Load, worker: int) -> None:
        step = worker
        while not load.stop.is_set():
            await self._send(load, step % len(self.steps))
            step += 1

    async def _open_loop(self, load: _Load, rate: float) -> None:
        interval_ns, due, step = 1e9 / rate, float(time.perf_counter_ns()), 0
        pending: set[asyncio.Task] = set()
        while not load.stop.is_set():
            task = asyncio.create_task(self._send(load, step % len(self.steps)))
            pending.add(task)
            task.add_done_callback(pending.discard)
            step += 1
            due += interval_ns
            # behind schedule: send the next one at once, but still let responses be read
            await asyncio.sleep(max(0.0, (due - time.perf_counter_ns()) / 1e9))
        await asyncio.gather(*pending)

    def _start(self, load: _Load, level: float) -> list[asyncio.Task]:
        if self.options.mode == "request_rate":
            return [asyncio.create_task(self._open_loop(load, level))]
        return [asyncio.create_task(self._closed_loop(load, w)) for w in range(int(level))]

    async def measure_level(self, level: float, on_window: OnWindow | None = None) -> LevelResult:
        load = _Load()
        tasks = self._start(load, level)
        try:
            result = await self._windows(load, level, on_window)
        finally:
            load.stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        result.completed = load.completed
        return result

    async def _windows(self, load: _Load, level: float, on_window: OnWindow | None) -> LevelResult:
        opts = self.options
        bounds, snapshots = [time.perf_counter_ns()], [await self.transport.statistics()]
        windows: list[ClientStats] = []
        per_window: list[list[Record]] = []
        for trial in range(1, opts.max_trials + 1):
            try:
                await asyncio.wait_for(load.failed.wait(), opts.window_ms / 1e3)
            except TimeoutError:
                pass
            if load.error is not None:
                raise PerfError(str(load.error)) from load.error
            bounds.append(time.perf_counter_ns())
            # a fresh list per window: workers append to whichever list `load.records` is now
            per_window.append(load.records)
            load.records = []
            del per_window[:-STABLE_WINDOWS]
            snapshots.append(await self.transport.statistics())
            windows.append(client_stats(per_window[-1], bounds[-1] - bounds[-2], opts.batch_size, self.percentiles))
            if on_window:
                on_window(level, trial, windows[-1])
            if is_stable(windows, opts.stability_pct, opts.percentile, STABLE_WINDOWS):
                break
        merged = [r for window in per_window for r in window]
        span = min(STABLE_WINDOWS, len(windows))
        return LevelResult(
            mode=opts.mode,
            level=level,
            client=client_stats(merged, bounds[-1] - bounds[-1 - span], opts.batch_size, self.percentiles),
            server=server_delta(snapshots[-1 - span], snapshots[-1]),
            stable=is_stable(windows, opts.stability_pct, opts.percentile, STABLE_WINDOWS),
            windows=len(windows),
        )

"""Background work of the scheduler process: tasks kept until they end, cancelled together on stop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from shared.bus import eager


class Tasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop = asyncio.get_running_loop()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)  # a task nobody references may be collected mid-flight
        task.add_done_callback(self._tasks.discard)

    def after(self, delay_s: float, job: Callable[[], Awaitable[Any]]) -> asyncio.TimerHandle:
        """Run `job()` in `delay_s` seconds (a handle to cancel it). The job starts in the timer's
        own callback and becomes a task only if it waits (shared/bus/eager.py): a batch's delay
        ending (the dynamic batcher's common timer) mostly sends the batch and returns."""
        return self._loop.call_later(max(0.0, delay_s), self._start, job)

    def _start(self, job: Callable[[], Awaitable[Any]]) -> None:
        task = eager.start(_await(job))
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()


async def _await(job: Callable[[], Awaitable[Any]]) -> None:
    await job()

"""Model loads, bounded: at most `--model-load-thread-count` run at once (Triton's flag, default 4).

A repository of hundreds of models asks for all of them at start. Loading them all at once
would start hundreds of threads that fight for the cores and the GIL; a bounded pool loads
them a few at a time, in the order asked, while the event loop (and the heartbeat thread)
stay responsive. `loading` counts the loads asked for and not finished, queued ones included:
the worker reports it in its heartbeats, and a loading worker is never taken for dead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class BoundedLoader:
    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="model-load")
        self.loading = 0
        self.on_idle: Callable[[], None] | None = None  # called when the last load in progress ends

    async def run(self, load: Callable[[], T]) -> T:
        """Run `load` on one of the loader's threads once one is free; its result or its exception."""
        self.loading += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, load)
        finally:
            self.loading -= 1
            if self.loading == 0 and self.on_idle is not None:
                self.on_idle()

    def shutdown(self) -> None:
        """Queued loads are dropped; running ones finish on their threads (a load cannot be interrupted)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

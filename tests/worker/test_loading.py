"""The bounded model loader: never more loads at once than its threads, every load finishes."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.worker.loading import BoundedLoader


def test_loads_run_at_most_threads_at_once_and_all_finish():
    async def main() -> None:
        loader = BoundedLoader(3)
        lock = threading.Lock()
        running, peak = 0, 0
        release = threading.Event()

        def load(i: int) -> int:
            nonlocal running, peak
            with lock:
                running += 1
                peak = max(peak, running)
            release.wait(timeout=10)
            with lock:
                running -= 1
            return i

        tasks = [asyncio.create_task(loader.run(lambda i=i: load(i))) for i in range(12)]
        while running < 3:  # the first three start; the other nine wait for a thread
            await asyncio.sleep(0.01)
        assert loader.loading == 12  # queued loads count as loading: the worker is not idle
        release.set()
        assert await asyncio.gather(*tasks) == list(range(12))
        assert peak == 3 and loader.loading == 0
        loader.shutdown()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_a_failed_load_raises_and_is_no_longer_loading():
    async def main() -> None:
        loader = BoundedLoader(1)

        def broken() -> None:
            raise ValueError("bad model")

        with pytest.raises(ValueError, match="bad model"):
            await loader.run(broken)
        assert loader.loading == 0
        loader.shutdown()

    asyncio.run(main())


def test_the_end_of_the_last_load_is_announced_once():
    """The worker beats at once when loading stops: a stale "loading" beat would give a worker that
    dies right after its loads the long loading grace before it is taken for dead."""

    async def main() -> list[int]:
        loader = BoundedLoader(2)
        seen: list[int] = []
        loader.on_idle = lambda: seen.append(loader.loading)
        gate = threading.Event()
        first = asyncio.create_task(loader.run(lambda: gate.wait(timeout=10)))
        second = asyncio.create_task(loader.run(lambda: 2))
        await second  # one load still running: not idle yet
        assert seen == []
        gate.set()
        await first
        with pytest.raises(ZeroDivisionError):  # a failed load ends a load too
            await loader.run(lambda: 1 // 0)
        loader.shutdown()
        return seen

    assert asyncio.run(main()) == [0, 0]

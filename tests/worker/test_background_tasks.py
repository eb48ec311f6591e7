"""services/worker/background_tasks.py: tasks kept while they run, let go when they end, cancelled
together on stop."""

from __future__ import annotations

import asyncio
import gc

from services.worker.background_tasks import BackgroundTasks


async def test_a_task_is_kept_while_it_runs_and_let_go_when_it_ends():
    tasks = BackgroundTasks()
    release = asyncio.Event()
    finished: list[str] = []

    async def work() -> None:
        await release.wait()
        finished.append("done")

    task = tasks.spawn(work())
    del task
    gc.collect()  # the loop's own reference is weak: only the set keeps it
    release.set()
    while not finished:
        await asyncio.sleep(0)
    await asyncio.sleep(0)  # the done callback runs after the task's last step
    assert finished == ["done"] and tasks._tasks == set()


async def test_cancel_all_cancels_every_task_still_running():
    tasks = BackgroundTasks()
    running = [tasks.spawn(asyncio.Event().wait()) for _ in range(3)]
    tasks.cancel_all()
    results = await asyncio.gather(*running, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)

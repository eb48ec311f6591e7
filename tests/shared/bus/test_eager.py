"""Eagerly started coroutines (shared/bus/eager.py): run at once, keep order, report errors."""

from __future__ import annotations

import asyncio
import contextvars

from shared.bus import eager

marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="")


async def test_a_coroutine_that_never_waits_runs_to_the_end_before_start_returns():
    seen = []

    async def work() -> None:
        seen.append("ran")

    assert eager.start(work()) is None
    assert seen == ["ran"]


async def test_a_coroutine_that_waits_goes_on_in_a_task_with_its_result():
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    seen = []

    async def work() -> None:
        seen.append("before")
        seen.append(await future)
        await asyncio.sleep(0)
        seen.append("after")

    task = eager.start(work())
    assert task is not None and seen == ["before"]
    future.set_result(7)
    await asyncio.wait_for(task, 5)
    assert seen == ["before", 7, "after"]


async def test_an_exception_from_an_awaited_future_reaches_the_coroutine():
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    caught = []

    async def work() -> None:
        try:
            await future
        except ValueError as exc:
            caught.append(str(exc))

    task = eager.start(work())
    future.set_exception(ValueError("bad"))
    await asyncio.wait_for(task, 5)
    assert caught == ["bad"]


async def test_errors_go_to_the_error_callback_never_to_the_caller():
    errors: list[BaseException] = []
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def fails_at_once() -> None:
        raise RuntimeError("now")

    async def fails_later() -> None:
        await future
        raise RuntimeError("later")

    assert eager.start(fails_at_once(), errors.append) is None
    task = eager.start(fails_later(), errors.append)
    future.set_result(None)
    await asyncio.wait_for(task, 5)
    assert [str(e) for e in errors] == ["now", "later"]


async def test_cancelling_the_task_cancels_what_the_coroutine_awaits():
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    outcome = []

    async def work() -> None:
        try:
            await never
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise

    task = eager.start(work())
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert outcome == ["cancelled"] and never.cancelled() and task.cancelled()


async def test_context_variables_set_by_the_coroutine_stay_in_it():
    marker.set("caller")

    async def work() -> None:
        marker.set("coroutine")

    eager.start(work())
    assert marker.get() == "caller"


async def test_serial_runner_keeps_order_while_a_callback_waits():
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    seen: list[int] = []
    errors: list[BaseException] = []

    async def callback(item: int) -> None:
        seen.append(item)
        if item == 1:
            await gate
            seen.append(-1)
        if item == 3:
            raise RuntimeError("three")

    runner = eager.SerialRunner(callback, errors.append)
    for item in range(5):
        runner.put(item)
    assert seen == [0, 1] and runner.backlog == 4  # 1 waits, 2..4 queue behind it
    gate.set_result(None)
    deadline = asyncio.get_running_loop().time() + 5
    while runner.backlog and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.001)
    assert seen == [0, 1, -1, 2, 3, 4]
    assert [str(e) for e in errors] == ["three"]

"""An instance's thread: calls run in order on one thread, results and errors come back."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.worker.batches.instance_thread import InstanceThread


async def test_calls_run_in_order_on_one_thread_off_the_loop():
    worker = InstanceThread("test-instance")
    try:
        seen: list[tuple[int, str]] = []

        def call(i: int) -> int:
            seen.append((i, threading.current_thread().name))
            return i * 2

        results = await asyncio.gather(*(worker.run(call, i) for i in range(20)))
        assert results == [i * 2 for i in range(20)]
        assert [i for i, _ in seen] == list(range(20))
        assert {name for _, name in seen} == {"test-instance"}
    finally:
        worker.shutdown()


async def test_an_exception_reaches_the_awaiting_coroutine():
    worker = InstanceThread("test-errors")
    try:

        def fails() -> None:
            raise ValueError("model failed")

        with pytest.raises(ValueError, match="model failed"):
            await worker.run(fails)
        assert await worker.run(lambda: "still serving") == "still serving"
    finally:
        worker.shutdown()


async def test_a_call_cancelled_before_it_starts_does_not_run_and_submit_works_as_an_executor():
    worker = InstanceThread("test-cancel")
    release = threading.Event()
    ran: list[str] = []
    try:
        first = asyncio.ensure_future(worker.run(release.wait, 10))
        second = asyncio.ensure_future(worker.run(ran.append, "second"))
        await asyncio.sleep(0)  # both handed over; the first blocks the thread
        second.cancel()
        release.set()
        assert await first is True
        with pytest.raises(asyncio.CancelledError):
            await second
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(worker, ran.append, "third") is None
        assert ran == ["third"]
    finally:
        worker.shutdown()
    with pytest.raises(RuntimeError):
        worker.submit(print)


async def test_call_answers_a_callback_on_the_loop_with_the_result_or_the_error():
    worker = InstanceThread("test-call")
    loop = asyncio.get_running_loop()
    answers: asyncio.Queue[tuple[object, BaseException | None, bool]] = asyncio.Queue()

    def on_done(result: object, error: BaseException | None) -> None:
        on_loop = asyncio.get_running_loop() is loop  # raises off the loop's thread
        answers.put_nowait((result, error, on_loop))

    def fails() -> None:
        raise ValueError("model failed")

    try:
        worker.call(threading.current_thread, (), on_done)
        worker.call(fails, (), on_done)
        thread, no_error, on_loop = await asyncio.wait_for(answers.get(), 10)
        assert (thread.name, no_error, on_loop) == ("test-call", None, True)
        nothing, error, on_loop = await asyncio.wait_for(answers.get(), 10)
        assert nothing is None and isinstance(error, ValueError) and str(error) == "model failed" and on_loop
    finally:
        worker.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        worker.call(fails, (), on_done)

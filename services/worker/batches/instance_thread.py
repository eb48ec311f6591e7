"""An instance's own thread, with a lighter hand-off from the event loop than `run_in_executor`.

Model code never runs on the worker's event loop (it may block, or make BLS calls that need
the loop). `loop.run_in_executor` on a one-thread ThreadPoolExecutor costs, per batch, a
concurrent Future with its Condition, a work item, the pool's thread accounting and two chained
futures copied across: about 15% of a python model child's CPU at batch 1 under load
(docs/performance.md). `run` hands the call over through a SimpleQueue and answers with one
`call_soon_threadsafe`; `call` answers a plain callback instead of an awaited future (no future,
no Task to wake: `BatchExecutor.start`). The class is still an Executor (`submit`, `shutdown`) for
the other uses.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")

_STOP = object()


class InstanceThread(Executor):
    """One thread running calls in the order they are handed over."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._stopped = False
        self._os_thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._os_thread.start()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on this thread; its result (or exception) back on the caller's loop. As with
        run_in_executor, a call cancelled before it starts does not run, and one already running
        runs to its end."""
        if self._stopped:
            raise RuntimeError("cannot schedule new calls after shutdown")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._calls.put((_run_for_loop, fn, args, loop, future))
        return await future

    def call(
        self,
        fn: Callable[..., T],
        args: tuple,
        on_done: Callable[[T | None, BaseException | None], None],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """`fn(*args)` on this thread, then `on_done(result, None)` (or `on_done(None, exception)`)
        on `loop`, the caller's running loop (given: CPython 3.11's `get_running_loop` makes a
        `getpid` system call each time, one per batch here). It always runs: nothing to cancel."""
        if self._stopped:
            raise RuntimeError("cannot schedule new calls after shutdown")
        self._calls.put((_run_for_callback, fn, args, loop or asyncio.get_running_loop(), on_done))

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        if self._stopped:
            raise RuntimeError("cannot schedule new calls after shutdown")
        future: Future[T] = Future()
        self._calls.put((_run_submitted, fn, args, kwargs, future))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop after the calls already handed over (`cancel_futures` is not supported: they run)."""
        if not self._stopped:
            self._stopped = True
            self._calls.put(_STOP)
        if wait and threading.current_thread() is not self._os_thread:
            self._os_thread.join()

    def _serve(self) -> None:
        while True:
            call = self._calls.get()
            if call is _STOP:
                return
            call[0](*call[1:])


def _run_submitted(fn: Callable[..., Any], args: tuple, kwargs: dict, future: Future[Any]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - handed to whoever waits, as an executor does
        future.set_exception(exc)
    else:
        future.set_result(result)


def _run_for_loop(
    fn: Callable[..., Any], args: tuple, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]
) -> None:
    if future.cancelled():  # read across threads: at worst a cancelled call still runs, harmlessly
        return
    try:
        result = fn(*args)
    except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
        _deliver_soon(loop, future, None, exc)
    else:
        _deliver_soon(loop, future, result, None)


def _run_for_callback(
    fn: Callable[..., Any],
    args: tuple,
    loop: asyncio.AbstractEventLoop,
    on_done: Callable[[Any, BaseException | None], None],
) -> None:
    result: Any = None
    error: BaseException | None = None
    try:
        result = fn(*args)
    except BaseException as exc:  # noqa: BLE001 - handed to the callback
        error = exc
    try:
        loop.call_soon_threadsafe(on_done, result, error)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass


def _deliver_soon(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any, exc: BaseException | None
) -> None:
    try:
        loop.call_soon_threadsafe(_deliver, future, result, exc)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass


def _deliver(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.cancelled():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)

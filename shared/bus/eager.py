"""Coroutines run at once, on the caller's stack, until their first real suspension.

A NATS callback or a flush that never waits for anything (the common case: a publish only
appends to nats-py's buffer) costs a Task, a loop iteration and a queue hand-off when run the
usual way. `start` steps the coroutine right away and only wraps the rest in a Task when it
actually waits on a future. This is what Python 3.12's `asyncio.eager_task_factory` does; the
services run on 3.11. Measured effect: docs/performance.md.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

Coro = Coroutine[Any, Any, None]


def start(coro: Coro, on_error: Callable[[BaseException], None] | None = None) -> asyncio.Task[None] | None:
    """Run `coro` until it finishes or waits; None if it finished, else the Task finishing it.

    It runs in a copy of the current context, as a Task would, so context variables it sets
    (the request id on log lines) do not leak into the caller. An exception raised before the
    first wait goes to `on_error` (logged when None), never to the caller."""
    context = contextvars.copy_context()
    try:
        waiting = context.run(coro.send, None)
    except StopIteration:
        return None
    except BaseException as exc:  # noqa: BLE001 - the caller is a read loop: nothing may escape
        _report(exc, on_error)
        return None
    task = asyncio.get_running_loop().create_task(_resume(coro, waiting, on_error), context=context)
    task.add_done_callback(lambda t: _abandon(coro, waiting) if t.cancelled() else None)
    return task


def _abandon(coro: Coro, waiting: Any) -> None:
    """The Task was cancelled before `_resume` ran: cancel the coroutine where it waits."""
    if getattr(coro, "cr_frame", None) is None:  # finished, or cancelled by `_resume` already
        return
    if waiting is not None:
        waiting.cancel()
    try:
        coro.throw(asyncio.CancelledError())
    except BaseException:  # noqa: BLE001 - the expected CancelledError, or whatever it ended with
        pass
    coro.close()


async def _resume(coro: Coro, waiting: Any, on_error: Callable[[BaseException], None] | None) -> None:
    """Go on with a coroutine `start` stepped until it yielded `waiting` (asyncio's protocol: a
    future to wait for, or None for a bare yield), the way asyncio.Task steps a coroutine."""
    while True:
        thrown: BaseException | None = None
        try:
            if waiting is None:
                await asyncio.sleep(0)
            else:
                waiting._asyncio_future_blocking = False
                await asyncio.wait((waiting,))  # done or cancelled; its outcome is for `coro` to read
        except asyncio.CancelledError as cancelled:  # our Task was cancelled: so is what the coroutine awaits
            if waiting is not None:
                waiting.cancel()
            thrown = cancelled
        try:
            waiting = coro.send(None) if thrown is None else coro.throw(thrown)
        except StopIteration:
            return
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001
            _report(exc, on_error)
            return


def _report(exc: BaseException, on_error: Callable[[BaseException], None] | None) -> None:
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        raise exc
    if on_error is not None:
        on_error(exc)
    elif not isinstance(exc, asyncio.CancelledError):
        log.error("unhandled error in an eagerly started coroutine: %s", exc, exc_info=exc)


class SerialRunner:
    """Runs `callback(item)` eagerly for each item put, one at a time, in order.

    Stands in for the `asyncio.Queue` plus task of a nats-py subscription: while a callback
    waits, later items queue behind it (the order a subscription guarantees), and run once it
    ends."""

    def __init__(self, callback: Callable[[Any], Awaitable[None]], on_error: Callable[[BaseException], None]) -> None:
        self._callback = callback
        self._on_error = on_error
        self._backlog: collections.deque[Any] = collections.deque()
        self._running: asyncio.Task[None] | None = None

    def put(self, item: Any) -> None:
        if self._running is not None:
            self._backlog.append(item)
            return
        self._running = start(self._callback(item), self._on_error)  # type: ignore[arg-type]
        if self._running is not None:
            self._running.add_done_callback(self._next)

    def _next(self, _: asyncio.Task[None]) -> None:
        self._running = None
        while self._backlog and self._running is None:
            self.put(self._backlog.popleft())

    @property
    def backlog(self) -> int:
        return len(self._backlog) + (self._running is not None)

    def cancel(self) -> None:
        self._backlog.clear()
        if self._running is not None:
            self._running.cancel()

"""Running one service process: logging, the event loop, and a clean stop on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import cProfile
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Protocol

import nats.errors
from nats.aio.client import Client as NATS

from shared.process.logcontext import JsonFormatter, RequestIdFilter

uvloop: ModuleType | None
try:
    import uvloop
except ImportError:  # uvloop is not available on every platform
    uvloop = None


class Service(Protocol):
    """What `serve_until` runs: a service that starts and stops on the bus."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def configure_logging(service: str, verbose: int = 0) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    if os.environ.get("SHOAL_LOG_JSON", "").lower() in ("1", "true"):
        handler.setFormatter(JsonFormatter(service))
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname).1s {service} %(name)s: %(request_tag)s%(message)s")
        )
    logging.basicConfig(level=logging.DEBUG if verbose > 0 else logging.INFO, handlers=[handler])
    logging.getLogger("nats").setLevel(logging.WARNING)  # its debug chatter is not Triton's verbose log


def run_service(main: Callable[[asyncio.Event], Awaitable[None]], name: str = "service") -> None:
    """Run `main(stop)`; SIGTERM/SIGINT set `stop`, and `main` shuts down its own way."""

    async def wrapper() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    profile_dir = os.environ.get("SHOAL_PROFILE_DIR")
    profiler = _start_profile() if profile_dir else None
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop if uvloop is not None else None) as runner:
            try:
                runner.run(wrapper())
            except (Exception, SystemExit):  # SystemExit: uvicorn's answer to a socket it cannot bind
                fail(name)  # before the runner's cleanup, which can wait forever
    finally:
        if profiler is not None and profile_dir:
            profiler.disable()
            profiler.dump_stats(os.path.join(profile_dir, f"{name}-{os.getpid()}.prof"))


def fail(name: str) -> None:
    """End a service whose `main` raised, at once, with the reason on stderr.

    Not through the runner's cleanup: it cancels every task the service started and waits for
    each, and a task that outlives its cancel (a bus watcher mid-retry) held a failed gateway
    for the whole exit timeout, deaf to SIGTERM (issue 28 item 14).
    """
    logging.getLogger(f"shoal.{name}").critical("%s failed", name, exc_info=True)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(1)


def _start_profile() -> cProfile.Profile:
    """A developer's tool (SHOAL_PROFILE_DIR): cProfile of the main thread, in thread CPU time.

    Thread CPU time, not wall time: on a loaded host a socket write that wakes its reader loses
    the core, and a wall-clock profile then charges that wait to the write (docs/performance.md).
    """
    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    return profiler


async def serve_until(stop: asyncio.Event, nc: NATS, service: Service, name: str, health_port: int = 0) -> None:
    """Start `service`, wait for `stop`, then stop it and drain the NATS connection. With a
    `health_port`, Triton's live and ready paths answer on it (shared/process/health.py): ready
    once started, while connected, until `stop` is set."""
    from shared.process.logsettings import follow

    health = None
    started = False
    if health_port:
        from shared.process.health import HealthPort

        health = HealthPort(health_port, lambda: started and nc.is_connected and not stop.is_set())
        await health.start()  # live during a long start (a repository loading its models)
    try:
        await follow(nc, name)
        started = await _start_unless_stopped(service, stop)
        try:
            await stop.wait()
        finally:
            await _stop(service, started)
            await _drain(nc)
    finally:
        if health is not None:
            await health.stop()


async def _drain(nc: NATS) -> None:
    """Drain the connection; where the bus is away (reconnecting, or closed by nats-py after its
    attempts), close it: nothing can be flushed to a server that is not there. `nats.drain()`
    raises ConnectionReconnectingError then, which ended a gateway stopped by `docker compose
    restart` (its NATS node stopped first) with a CRITICAL traceback and a failed exit."""
    if nc.is_closed:
        return
    if nc.is_reconnecting:
        await nc.close()
        return
    try:
        await nc.drain()
    except (nats.errors.ConnectionReconnectingError, nats.errors.ConnectionClosedError) as exc:
        logging.getLogger(__name__).info("the bus went away while draining (%s): closed", type(exc).__name__)
        await nc.close()


async def _start_unless_stopped(service: Service, stop: asyncio.Event) -> bool:
    """`service.start()`, cancelled if `stop` is set first: True once started, else False.

    A start can wait on the other services (a gateway or worker waits up to a minute for the
    repository's models bucket): a SIGTERM must not wait for it to end. Else `shoal serve` whose
    repository fails at start waits out its exit timeout (30 s by default) for its gateway and
    worker, deaf to SIGTERM in that wait, and then kills them."""
    starting = asyncio.ensure_future(service.start())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        starting.cancel()
        raise
    finally:
        stopping.cancel()
    if starting.done():
        starting.result()  # its failure, if it failed
        return True
    await _cancelled(starting)
    if starting.done() and not starting.cancelled() and starting.exception() is not None:
        logging.getLogger(__name__).debug("a start stopped by a signal ended in %r", starting.exception())
    return False


CANCEL_TRIES = 50  # a tenth of a second each: how long a start may take to end once cancelled


async def _cancelled(task: asyncio.Future[None]) -> None:
    """Cancel `task` and wait for it to end, cancelling again where a cancel was swallowed. Seen:
    a gateway's start waiting for the models bucket stayed "cancelling" and went on waiting for its
    whole minute (`test_a_stop_while_starting_ends_the_start_at_once` failed so in three runs of
    three one afternoon); the likely culprit is `asyncio.wait_for` inside nats-py's requests, which
    in Python 3.11 loses a cancel that arrives as its inner future completes. Not `await task`: its
    CancelledError is not this task's."""
    for _ in range(CANCEL_TRIES):
        task.cancel()
        done, _ = await asyncio.wait((task,), timeout=0.1)
        if done:
            return
    logging.getLogger(__name__).warning("a start cancelled by a stop did not end; stopping anyway")


async def _stop(service: Service, started: bool) -> None:
    """`service.stop()`; after a start cut short, as far as it goes: the parts never started
    cannot stop (a gateway's ownership, a worker's heartbeat thread), the ones started must."""
    if started:
        await service.stop()
        return
    try:
        await service.stop()
    except Exception:
        logging.getLogger(__name__).debug("stopped while starting: a part never started", exc_info=True)

"""A model's own is_ready() as python_backend runs it: one check in flight per instance, a slow
answer is "not ready" for the request that waited, and the next request takes its answer."""

from __future__ import annotations

import asyncio
import threading

from services.worker.readiness import TIMED_OUT, TIMED_OUT_IN_FLIGHT, UserReadiness, instances_ready


class Gate:
    """A runner whose readiness() blocks until released, counting its calls."""

    checks_readiness = True

    def __init__(self, answer: tuple[bool, str] = (True, "")) -> None:
        self.answer = answer
        self.release = threading.Event()
        self.calls = 0

    def readiness(self) -> tuple[bool, str]:
        self.calls += 1
        assert self.release.wait(30)
        return self.answer


def test_a_slow_check_times_out_then_the_next_request_waits_for_it():
    async def go():
        runner = Gate()
        check = UserReadiness(runner, timeout_s=0.2)
        assert await check.check() == (False, TIMED_OUT)
        waiting = asyncio.ensure_future(check.check())  # joins the check in flight: no second call
        await asyncio.sleep(0)
        runner.release.set()
        assert await waiting == (True, "")
        assert runner.calls == 1
        assert await check.check() == (True, "") and runner.calls == 2  # a new request, a new check

    asyncio.run(go())


def test_a_request_joining_a_check_that_stays_slow_says_so():
    async def go():
        runner = Gate()
        check = UserReadiness(runner, timeout_s=0.1)
        first = asyncio.ensure_future(check.check())
        await asyncio.sleep(0)
        assert await check.check() == (False, TIMED_OUT_IN_FLIGHT)
        assert await first == (False, TIMED_OUT)
        runner.release.set()

    asyncio.run(go())


def test_every_instance_must_be_ready_in_python_backends_words():
    async def go():
        ready, refusing = Gate(), Gate((False, ""))
        ready.release.set()
        refusing.release.set()
        checks = [("m_0", UserReadiness(ready)), ("m_1", UserReadiness(refusing))]
        return await instances_ready(checks)

    assert asyncio.run(go()) == (False, "Model 'm_1' is not ready (user-defined check failed).")

"""Model readiness asks the instances' own `is_ready()` (python_backend's user-defined readiness,
`RunUserModelReadinessCheck` in src/python_be.cc): on every readiness request, not on a timer.

Per instance: at most one check in flight (a request that finds one waits for it and takes its
answer); an answer slower than 5 s is "not ready" for that request, and the check goes on, so the
next request waits for it (python_backend's `kUserModelReadinessTimeoutMs` and its words).
"""

from __future__ import annotations

import asyncio

from services.worker.backends.runner import Runner

TIMEOUT_S = 5.0  # python_backend's kUserModelReadinessTimeoutMs
TIMED_OUT = "Timed out waiting for user-defined is_ready() response"
TIMED_OUT_IN_FLIGHT = "Timed out waiting for in-flight is_ready() response"


class UserReadiness:
    """One instance's `is_ready()` checks."""

    def __init__(self, runner: Runner, timeout_s: float = TIMEOUT_S) -> None:
        self.runner = runner
        self.timeout_s = timeout_s
        self.inflight: asyncio.Future[tuple[bool, str]] | None = None

    async def check(self) -> tuple[bool, str]:
        joined = self.inflight is not None and not self.inflight.done()
        if self.inflight is None or not joined:
            # the loop's default threads, not the instance's: it runs beside a long execute
            self.inflight = asyncio.get_running_loop().run_in_executor(None, self.runner.readiness)
        try:
            return await asyncio.wait_for(asyncio.shield(self.inflight), self.timeout_s)
        except TimeoutError:
            return False, TIMED_OUT_IN_FLIGHT if joined else TIMED_OUT


async def instances_ready(checks: list[tuple[str, UserReadiness]]) -> tuple[bool, str]:
    """Every instance ready (core's `TritonModel::IsReady`), else the first one's reason, as
    python_backend words it (`TRITONBACKEND_ModelInstanceReady`)."""
    answers = await asyncio.gather(*(check.check() for _, check in checks))
    for (name, _), (ready, message) in zip(checks, answers):
        if not ready:
            return False, message or f"Model '{name}' is not ready (user-defined check failed)."
    return True, ""

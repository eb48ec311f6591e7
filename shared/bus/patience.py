"""Asking again while nobody answers on the bus for a moment: a service restarting or reconnecting
(its subject has no responders), a KV stream electing a new leader after a node loss. Both the
repository's clients (`repository_client.py`) and the KV writes (`buckets.py`) wait out such a gap
within a bound, so that a gap of a second is not an error while a service that is gone still is,
within seconds."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


async def patiently(
    attempt: Callable[[], Awaitable[T]],
    gaps: tuple[type[BaseException], ...],
    within_s: float,
    first_pause_s: float = 0.05,
    longest_pause_s: float = 0.5,
    what: str = "",
) -> T:
    """`attempt()`'s result, asked again after a pause (doubling up to `longest_pause_s`) while it
    raises one of `gaps`; the last such error is raised when the next pause would end past
    `within_s` after the first try. Any other error is raised at once. `what`, when given, is
    logged at each retry (info: a gap is worth a line, not a warning)."""
    give_up = time.monotonic() + within_s
    pause = first_pause_s
    while True:
        try:
            return await attempt()
        except gaps:
            if give_up - time.monotonic() <= pause:
                raise
            if what:
                log.info("%s; asking again", what)
            await asyncio.sleep(pause)
            pause = min(pause * 2, longest_pause_s)

import asyncio
import time

import pytest

from shared.bus.patience import patiently


class Gap(Exception):
    pass


def flaky(gaps: int, error: type[Exception] = Gap):
    """An attempt that raises `error` its first `gaps` times, then answers how many tries it took."""
    tries = 0

    async def attempt() -> int:
        nonlocal tries
        tries += 1
        if tries <= gaps:
            raise error("nobody there")
        return tries

    return attempt


async def test_a_gap_is_waited_out() -> None:
    assert await patiently(flaky(3), (Gap,), within_s=10, first_pause_s=0.001) == 4


async def test_a_gap_longer_than_the_bound_raises_the_gap_within_it() -> None:
    started = time.monotonic()
    with pytest.raises(Gap):
        await patiently(flaky(10**6), (Gap,), within_s=0.3, first_pause_s=0.01, longest_pause_s=0.05)
    assert time.monotonic() - started < 0.3 + 0.2  # the last pause is not taken when it would end past the bound


async def test_other_errors_are_not_retried() -> None:
    attempt = flaky(1, ValueError)
    with pytest.raises(ValueError):
        await patiently(attempt, (Gap,), within_s=10, first_pause_s=0.001)
    assert await attempt() == 2  # one try only before


async def test_pauses_double_up_to_the_longest(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def recording(delay: float) -> None:
        slept.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", recording)
    await patiently(flaky(5), (Gap,), within_s=60, first_pause_s=0.1, longest_pause_s=0.5)
    assert slept == [0.1, 0.2, 0.4, 0.5, 0.5]

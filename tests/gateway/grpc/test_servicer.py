"""The gRPC servicer's stream plumbing (services/gateway/grpc/servicer.py)."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from services.gateway.grpc.servicer import Inbox


async def test_inbox_wakes_a_waiting_reader_and_keeps_the_order() -> None:
    inbox = Inbox(asyncio.get_running_loop())

    async def write() -> None:
        inbox.put_nowait("a")
        inbox.put_nowait("b")

    reader = asyncio.ensure_future(inbox.get())  # its first step runs before the writer's: it waits
    writer = asyncio.ensure_future(write())
    assert await asyncio.wait_for(reader, 10) == "a"
    assert await asyncio.wait_for(inbox.get(), 10) == "b"
    await writer


@given(st.lists(st.integers(), max_size=50))
def test_inbox_gives_back_what_was_put_in_order(items: list[int]) -> None:
    async def run() -> list[int]:
        inbox = Inbox(asyncio.get_running_loop())
        for item in items:
            inbox.put_nowait(item)
        return [await inbox.get() for _ in items]

    assert asyncio.run(run()) == items

import asyncio

from shared.bus.revisions import Revisions


async def test_seen_returns_once_the_revision_is_applied() -> None:
    revisions = Revisions()
    waiter = asyncio.create_task(revisions.seen(3, timeout=30))
    revisions.advance(1)
    await asyncio.sleep(0)
    assert not waiter.done()
    revisions.advance(3)
    assert await asyncio.wait_for(waiter, 30)


async def test_seen_gives_up_at_its_timeout() -> None:
    revisions = Revisions()
    revisions.advance(2)
    assert not await revisions.seen(5, timeout=0.05)
    assert await revisions.seen(2, timeout=0)


def test_a_replayed_older_revision_does_not_move_it_back() -> None:
    revisions = Revisions()
    revisions.advance(7)
    revisions.advance(4)  # a watch restarted after a reconnect replays the bucket
    assert revisions.latest == 7

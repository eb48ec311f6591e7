"""The local channel read on plain threads (a python model's instance process, the hot loop of
docs/design.md §9), against the gateway's own end: HELLO first, frames both ways from any thread,
the socket the user's alone, and a stop that ends every connection."""

from __future__ import annotations

import asyncio
import queue
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.bus import local_channel
from shared.bus.thread_channel import ThreadChannel, ThreadListener
from shared.wire.channel_frames import BATCH, DONE
from tests.serving import wait_until


@pytest.fixture
def path() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="tc", dir="/tmp"))  # short: a socket's path has 108 bytes
    try:
        yield root / f"{local_channel.DIRECTORY}-test" / local_channel.SOCKET
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_batches_are_read_on_a_thread_and_answered_from_any_thread(path: Path) -> None:
    seen: queue.SimpleQueue[tuple[str, int, bytes]] = queue.SimpleQueue()

    def on_frame(channel: ThreadChannel, kind: int, payload: bytes) -> None:
        seen.put((threading.current_thread().name, kind, payload))
        channel.send(DONE, b"here:" + payload)  # answered on the reading thread
        threading.Thread(target=channel.send, args=(DONE, b"there:" + payload)).start()  # and from another

    listener = ThreadListener(path, b"worker-1", on_frame)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700

    async def gateway() -> list[bytes]:
        answers: asyncio.Queue[bytes] = asyncio.Queue()
        closed = asyncio.Event()
        channel = await local_channel.connect(
            str(path), "worker-1", lambda _c, _k, p: answers.put_nowait(p), lambda _c: closed.set(), 10
        )
        for i in range(3):
            assert channel.send(BATCH, f"b{i}".encode())
        got = [await asyncio.wait_for(answers.get(), 10) for _ in range(6)]
        await asyncio.to_thread(listener.stop)
        await asyncio.wait_for(closed.wait(), 10)  # the worker's stop closes the connection
        return got

    got = asyncio.run(gateway())
    assert sorted(got) == sorted([f"{where}:b{i}".encode() for where in ("here", "there") for i in range(3)])
    frames = [seen.get(timeout=1) for _ in range(3)]
    assert [(kind, payload) for _, kind, payload in frames] == [(BATCH, b"b0"), (BATCH, b"b1"), (BATCH, b"b2")]
    assert all(name == "shoal-channel" for name, _, _ in frames)
    assert not listener.channels


def test_a_gateway_that_expects_another_worker_gets_no_byte_through(path: Path) -> None:
    listener = ThreadListener(path, b"worker-1", lambda *_: None)
    try:

        async def gateway() -> None:
            await local_channel.connect(str(path), "worker-2", lambda *_: None, None, 10)

        with pytest.raises(PermissionError):
            asyncio.run(gateway())
    finally:
        listener.stop()


def test_a_channel_its_gateway_closed_refuses_to_send(path: Path) -> None:
    opened: queue.SimpleQueue[ThreadChannel] = queue.SimpleQueue()
    listener = ThreadListener(path, b"worker-1", lambda channel, _k, _p: opened.put(channel))

    async def gateway() -> ThreadChannel:
        closed = asyncio.Event()
        channel = await local_channel.connect(str(path), "worker-1", lambda *_: None, lambda _c: closed.set(), 10)
        channel.send(BATCH, b"x")
        worker_end = await asyncio.to_thread(opened.get, True, 10)  # the worker read it: now the gateway goes
        channel.close()
        await asyncio.wait_for(closed.wait(), 10)
        return worker_end

    try:
        channel = asyncio.run(gateway())
        wait_until(lambda: not channel.open, 10, "the worker's end saw the gateway go", 0.01)
        assert not channel.send(DONE, b"y")
        assert not listener.channels
    finally:
        listener.stop()

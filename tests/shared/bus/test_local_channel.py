"""The local channel's connection, over real Unix sockets: frames both ways, the end seen at once,
and a process of another user refused (docs/design.md §9)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from shared.bus import local_channel
from shared.bus.local_channel import Channel
from shared.wire.channel_frames import BATCH, DONE, HELLO, MAX_FRAME


def hello_to(worker: str) -> Callable[[Channel], None]:
    """A listener's `on_open`, as a worker's: it says who it is first."""
    return lambda channel: channel.send(HELLO, worker.encode())


def channel_path(root: Path) -> Path:
    """Where a worker's socket is: `<…>/shoal-channel…/worker.sock` (shared/bus/local_channel.py)."""
    return root / f"{local_channel.DIRECTORY}-test" / local_channel.SOCKET


async def frames_go_both_ways_and_a_closed_end_is_seen(tmp_path: Path) -> None:
    got: asyncio.Queue[tuple[str, int, bytes]] = asyncio.Queue()
    closed = asyncio.Event()
    accepted: list[Channel] = []

    def worker_frame(channel: Channel, kind: int, payload: bytes) -> None:
        accepted.append(channel)
        got.put_nowait(("worker", kind, payload))
        channel.send(DONE, payload[::-1])

    path = channel_path(tmp_path)
    server = await local_channel.listen(path, worker_frame, lambda c: None, hello_to("w1"))
    client = await local_channel.connect(
        str(path), "w1", lambda c, k, p: got.put_nowait(("gateway", k, p)), lambda c: closed.set(), timeout=5
    )
    assert client.send(BATCH, b"batch")
    assert await asyncio.wait_for(got.get(), 5) == ("worker", BATCH, b"batch")
    assert await asyncio.wait_for(got.get(), 5) == ("gateway", DONE, b"hctab")
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    accepted[0].close()  # the worker's end goes: the gateway's sees it
    await asyncio.wait_for(closed.wait(), 5)
    assert not client.open
    assert not client.send(BATCH, b"late")
    server.close()
    await server.wait_closed()


async def what_is_sent_before_a_close_is_written(tmp_path: Path) -> None:
    """Frames go at the end of the loop's turn; a close in the same turn writes them first."""
    got: asyncio.Queue[bytes] = asyncio.Queue()
    path = channel_path(tmp_path)
    server = await local_channel.listen(path, lambda c, k, p: got.put_nowait(p), lambda c: None, hello_to("w1"))
    client = await local_channel.connect(str(path), "w1", lambda c, k, p: None, None, timeout=5)
    assert client.send(BATCH, b"one") and client.send(BATCH, b"two")
    client.close()
    assert [await asyncio.wait_for(got.get(), 5) for _ in range(2)] == [b"one", b"two"]
    server.close()
    await server.wait_closed()


async def a_socket_that_is_not_the_workers_gets_nothing(tmp_path: Path) -> None:
    """What a gateway opens is named by a bus message: a path not shaped like a worker's channel is
    refused before connecting; a socket that does not say it is that worker gets no byte."""
    received = bytearray()

    class Other(asyncio.Protocol):  # some other service of the same user, at a channel-shaped path
        def data_received(self, data: bytes) -> None:
            received.extend(data)

    loop = asyncio.get_running_loop()
    odd = tmp_path / "redis.sock"
    other_server = await loop.create_unix_server(Other, str(odd))
    with pytest.raises(PermissionError, match="not a local channel"):
        await local_channel.connect(str(odd), "w1", lambda c, k, p: None, None, timeout=5)
    path = channel_path(tmp_path)
    local_channel.private_directory(path.parent)
    silent = await loop.create_unix_server(Other, str(path))
    with pytest.raises(TimeoutError):
        await local_channel.connect(str(path), "w1", lambda c, k, p: None, None, timeout=0.5)
    silent.close()
    await silent.wait_closed()
    impostor = await local_channel.listen(path, lambda c, k, p: None, lambda c: None, hello_to("w2"))
    with pytest.raises(PermissionError, match="worker w2's, not w1's"):
        await local_channel.connect(str(path), "w1", lambda c, k, p: None, None, timeout=5)
    assert bytes(received) == b""
    impostor.close()
    await impostor.wait_closed()
    other_server.close()
    await other_server.wait_closed()


async def a_frame_over_the_limit_is_not_sent(tmp_path: Path) -> None:
    path = channel_path(tmp_path)
    server = await local_channel.listen(path, lambda c, k, p: None, lambda c: None, hello_to("w1"))
    client = await local_channel.connect(str(path), "w1", lambda c, k, p: None, None, timeout=5)
    assert not client.send(BATCH, bytes(MAX_FRAME + 1))  # NATS takes it (or refuses it, with its own error)
    client.close()
    server.close()
    await server.wait_closed()


async def a_peer_that_dies_is_seen_at_once(tmp_path: Path) -> None:
    """The worker's process killed: the gateway's end reads EOF, no liveness timeout."""
    path = channel_path(tmp_path)
    script = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from shared.bus import local_channel\n"
        "async def main():\n"
        "    hello = lambda c: c.send(3, b'w1')\n"
        "    await local_channel.listen(Path(sys.argv[1]), lambda c, k, p: None, lambda c: None, hello)\n"
        "    print('ready', flush=True)\n"
        "    await asyncio.Event().wait()\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert (await asyncio.to_thread(proc.stdout.readline)).strip() == b"ready"
        closed = asyncio.Event()
        client = await local_channel.connect(str(path), "w1", lambda c, k, p: None, lambda c: closed.set(), timeout=5)
        assert client.open
        proc.kill()
        await asyncio.wait_for(closed.wait(), 5)
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _connect_as_nobody(path: str) -> int:
    """Fork a process that becomes user 'nobody', connects, sends a frame and waits: exit 0 if the
    other end closed on it without a word, 1 if it was answered or kept open, 2 if it could not."""
    pid = os.fork()
    if pid == 0:  # the child: socket calls only, then _exit
        code = 2
        try:
            os.setuid(65534)
            sock = socket.socket(socket.AF_UNIX)
            sock.settimeout(5)
            sock.connect(path)
            try:
                sock.sendall(bytes([BATCH, 0, 0, 0, 3]) + b"bad")
                code = 0 if sock.recv(1) == b"" else 1
            except (ConnectionResetError, BrokenPipeError):  # closed on: refused
                code = 0
            except TimeoutError:
                code = 1
        except BaseException:  # noqa: BLE001 - a child reports by its exit code only
            pass
        os._exit(code)
    return pid


async def a_process_of_another_user_is_refused(_: Path) -> None:
    """Root passes the directory's 0700; SO_PEERCRED still refuses another user's process: the
    channel is closed before any frame is read."""
    seen: list[bytes] = []
    top = Path(tempfile.mkdtemp(prefix="shoal-test-channel-"))  # in /tmp: 'nobody' can pass /tmp, not pytest's
    path = channel_path(top)
    server = await local_channel.listen(path, lambda c, k, p: seen.append(p), lambda c: None, hello_to("w1"))
    try:
        os.chmod(top, 0o755)
        os.chmod(path.parent, 0o711)  # let 'nobody' reach the socket itself: only the peer check stands
        os.chmod(path, 0o666)
        pid = _connect_as_nobody(str(path))
        _, status = await asyncio.to_thread(os.waitpid, pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert seen == []
    finally:
        server.close()
        await server.wait_closed()
        shutil.rmtree(top)


def run_on(loop: str, scenario: Callable[[Path], Coroutine[Any, Any, None]], tmp_path: Path) -> None:
    """The services run on uvloop where it is installed, whose transports and sockets are classes
    of its own: every scenario runs on both loops."""
    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        uvloop.run(scenario(tmp_path))
    else:
        asyncio.run(scenario(tmp_path))


LOOPS = pytest.mark.parametrize("loop", ["asyncio", "uvloop"])


@LOOPS
def test_frames_go_both_ways_and_a_closed_end_is_seen(loop, tmp_path):
    run_on(loop, frames_go_both_ways_and_a_closed_end_is_seen, tmp_path)


@LOOPS
def test_what_is_sent_before_a_close_is_written(loop, tmp_path):
    run_on(loop, what_is_sent_before_a_close_is_written, tmp_path)


@LOOPS
def test_a_socket_that_is_not_the_workers_gets_nothing(loop, tmp_path):
    run_on(loop, a_socket_that_is_not_the_workers_gets_nothing, tmp_path)


@LOOPS
def test_a_frame_over_the_limit_is_not_sent(loop, tmp_path):
    run_on(loop, a_frame_over_the_limit_is_not_sent, tmp_path)


@LOOPS
def test_a_peer_that_dies_is_seen_at_once(loop, tmp_path):
    run_on(loop, a_peer_that_dies_is_seen_at_once, tmp_path)


@LOOPS
@pytest.mark.skipif(os.getuid() != 0, reason="switching to another user takes root")
def test_a_process_of_another_user_is_refused(loop, tmp_path):
    run_on(loop, a_process_of_another_user_is_refused, tmp_path)


def test_an_advertisement_is_reachable_only_from_its_own_host():
    ad = local_channel.advertised("host-a", Path("/tmp/x/w.sock"))
    assert local_channel.reachable(ad, "host-a") == "/tmp/x/w.sock"
    assert local_channel.reachable(ad, "host-b") == ""
    assert local_channel.reachable("", "host-a") == ""

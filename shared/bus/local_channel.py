"""The local channel's connection (docs/design.md §9): frames between a gateway and a worker on one
host over a Unix-domain stream socket, for the processes of one user only.

Both ends are a `Channel`: an asyncio protocol that hands each whole frame to `on_frame` as it is
read (on the loop, in order, no task per frame) and writes the frames of a loop turn in one
`writelines`. Who is at the other end is checked with the kernel's word for it (`SO_PEERCRED`): a
process of another user is closed on at once, whichever end it is; the socket's directory is the
user's alone (0700) too. The socket a gateway opens is named by a bus message, so the gateway opens
only a path shaped like a worker's channel (`check_socket`) and writes nothing before the worker
said who it is (`HELLO`): a name that leads to some other socket of the user's gets no batch.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, cast

from shared.wire.channel_frames import HELLO, FrameError, FrameReader, header

log = logging.getLogger("shoal.channel")

OnFrame = Callable[["Channel", int, bytes], None]
OnChannel = Callable[["Channel"], None]

_UCRED = struct.Struct("3i")  # pid, uid, gid
SOCKET = "worker.sock"
DIRECTORY = "shoal-channel"  # the prefix of a worker's socket directory (shared/process/scratch.py)


def supported() -> bool:
    """Unix sockets whose peer the kernel names (Linux's SO_PEERCRED): elsewhere, NATS only."""
    return hasattr(socket, "SO_PEERCRED") and hasattr(socket, "AF_UNIX")


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket, as the kernel says."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return int(_UCRED.unpack(raw)[1])


class FrameSink(Protocol):
    """Where a worker writes a batch's completion: the channel the batch came by, read on the event
    loop (`Channel`) or on a plain thread (`shared.bus.thread_channel.ThreadChannel`)."""

    name: str

    @property
    def open(self) -> bool: ...

    def send(self, kind: int, payload: bytes) -> bool: ...

    def close(self) -> None: ...


class Channel(asyncio.Protocol):
    """One end of a local channel. `on_open` runs once the peer passed the user check."""

    def __init__(self, on_frame: OnFrame, on_closed: OnChannel | None = None, on_open: OnChannel | None = None) -> None:
        self.on_frame = on_frame
        self.on_closed = on_closed
        self.on_open = on_open
        self.transport: asyncio.Transport | None = None
        self.name = ""  # the peer, for log lines: set by whoever opened or accepted it
        self._reader = FrameReader()
        self._outgoing: list[bytes] = []  # frames written in this turn of the loop, sent at its end
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio.Transport's subclasses
        sock = stream.get_extra_info("socket")
        if sock is None or peer_uid(sock) != os.getuid():
            log.warning("local channel %s: refused a process of another user", self.name or "?")
            stream.abort()
            return
        self.transport = stream
        self._loop = asyncio.get_running_loop()
        if self.on_open is not None:
            self.on_open(self)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except FrameError as exc:
            log.error("local channel %s: %s; closing it", self.name, exc)
            self.close()
            return
        for kind, payload in frames:
            self.on_frame(self, kind, payload)

    def connection_lost(self, exc: Exception | None) -> None:
        was_open = self.transport is not None
        self.transport = None
        self._outgoing = []
        if was_open and self.on_closed is not None:
            self.on_closed(self)

    def send(self, kind: int, payload: bytes) -> bool:
        """Write one frame at the end of this turn of the loop, with the others written in it (one
        system call, one wake-up of the peer for all of them, as `shared/bus/hot_path.py` does for
        NATS: the completions one read brings each send a batch); False when it cannot go (the
        channel is closed, or the frame is over the limit): NATS takes it then."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return False
        try:
            head = header(kind, len(payload))
        except FrameError:
            return False
        if not self._outgoing:
            assert self._loop is not None
            self._loop.call_soon(self._flush)
        self._outgoing += (head, payload)
        return True

    def _flush(self) -> None:
        frames, self._outgoing = self._outgoing, []
        if frames and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(frames)

    def close(self) -> None:
        """Close after what was sent in this turn is written (a transport's close flushes its buffer)."""
        self._flush()
        if self.transport is not None:
            self.transport.close()


def private_directory(path: Path) -> Path:
    """`path` made (or checked) as a directory that only this user can enter: a socket in it is
    reachable by nobody else whatever its own mode (some systems ignore a socket's mode)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to another user: no local channel there")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


async def listen(path: Path, on_frame: OnFrame, on_closed: OnChannel, on_open: OnChannel) -> asyncio.AbstractServer:
    """Accept local channels on a socket at `path` (its directory private, the socket 0600)."""
    private_directory(path.parent)
    path.unlink(missing_ok=True)  # a socket file left by a killed process of the same name
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(lambda: Channel(on_frame, on_closed, on_open), str(path))
    os.chmod(path, 0o600)
    return server


def check_socket(path: str) -> None:
    """Refuse (PermissionError) a path that is not a worker's channel socket of this user: what a
    gateway opens is named by a bus message, so it must be `<…>/shoal-channel…/worker.sock`, a
    socket of this user in a directory of this user's that nobody else may enter."""
    where = Path(path)
    socket_info = os.lstat(where)
    directory_info = os.lstat(where.parent)
    if (
        where.name != SOCKET
        or not where.parent.name.startswith(DIRECTORY)
        or not stat.S_ISSOCK(socket_info.st_mode)
        or not stat.S_ISDIR(directory_info.st_mode)
        or socket_info.st_uid != os.getuid()
        or directory_info.st_uid != os.getuid()
        or stat.S_IMODE(directory_info.st_mode) & 0o077
    ):
        raise PermissionError(f"{path} is not a local channel of this user's workers")


async def connect(path: str, worker: str, on_frame: OnFrame, on_closed: OnChannel | None, timeout: float) -> Channel:
    """Open a local channel to the worker `worker` at `path`: the path checked first, and nothing
    written before the peer said, in its HELLO, that it is that worker. Raises OSError (PermissionError
    for a refusal) or TimeoutError when it cannot."""
    check_socket(path)
    loop = asyncio.get_running_loop()
    hello: asyncio.Future[str] = loop.create_future()

    def first(channel: Channel, kind: int, payload: bytes) -> None:
        if kind == HELLO and not hello.done():
            hello.set_result(payload.decode(errors="replace"))
            channel.on_frame = on_frame
        elif not hello.done():
            hello.set_exception(PermissionError(f"the local channel at {path} did not say who it is"))

    transport, channel = await asyncio.wait_for(
        loop.create_unix_connection(lambda: Channel(first, on_closed), path), timeout
    )
    try:
        if not channel.open:  # refused: the listener is another user's
            raise PermissionError(f"the local channel at {path} belongs to another user")
        said = await asyncio.wait_for(hello, timeout)
        if said != worker:
            raise PermissionError(f"the local channel at {path} is worker {said}'s, not {worker}'s")
    except BaseException:
        channel.on_closed = None
        transport.abort()
        raise
    channel.name = worker
    return channel


def advertised(host: str, path: Path) -> str:
    """How a worker names its channel to schedulers: the host token (§3) and the socket's path."""
    return f"{host}|{path}"


def reachable(advertisement: str, host: str) -> str:
    """The socket path of an advertisement when it is on this host (the same host token), else ''."""
    their_host, _, path = advertisement.partition("|")
    return path if their_host == host and path else ""

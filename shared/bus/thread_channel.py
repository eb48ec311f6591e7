"""A worker's end of the local channel on plain threads, without the event loop (docs/design.md §9,
"The hot loop"): what a python model's instance process uses, as Triton's stub runs one plain loop
(read a request, call `execute`, write the response).

The same socket, directory, frames and checks as `shared.bus.local_channel` (the peer must be a
process of this user, the worker says HELLO first); only who reads differs. A thread accepts the
connections, and each connection has a thread of its own that reads its frames with blocking
`recv` calls and hands each to `on_frame` on that thread: the worker runs the batch right there
when it can (`services/worker/batches/hot_loop.py`) and hands it to its event loop otherwise.
Frames are written with one blocking `sendall` under the connection's lock, from whichever thread
answers (the reading thread, or the event loop for a batch it ran).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path

from shared.bus.local_channel import peer_uid, private_directory
from shared.wire.channel_frames import HELLO, FrameError, FrameReader, header

log = logging.getLogger("shoal.channel")

RECV_BYTES = 256 * 1024
# a write the gateway does not take in this long closes the channel (its batches' completions then
# go over NATS, as for any channel that closes) instead of holding a thread forever
SEND_TIMEOUT_S = 10


class ThreadChannel:
    """One accepted connection: `send` from any thread; its reading thread calls `on_frame`."""

    def __init__(self, sock: socket.socket, on_frame: Callable[[ThreadChannel, int, bytes], None]) -> None:
        self.sock = sock
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", SEND_TIMEOUT_S, 0))  # not recv
        self.on_frame = on_frame
        self.name = "gateway"  # for log lines
        self.on_closed: Callable[[ThreadChannel], None] | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def open(self) -> bool:
        return not self._closed

    def send(self, kind: int, payload: bytes) -> bool:
        """Write one frame now; False when it cannot go (closed, over the limit): NATS takes it then."""
        if self._closed:
            return False
        try:
            head = header(kind, len(payload))
        except FrameError:
            return False
        try:
            with self._lock:
                self.sock.sendall(head + payload)
        except OSError as exc:
            log.warning("local channel %s: cannot write (%s); closing it", self.name, exc)
            self.close()
            return False
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reading thread: it closes the socket

    def serve(self) -> None:
        """The reading thread: frames to `on_frame` until the peer or `close` ends the connection."""
        reader = FrameReader()
        try:
            while not self._closed:
                data = self.sock.recv(RECV_BYTES)
                if not data:
                    break
                for kind, payload in reader.feed(data):
                    self.on_frame(self, kind, payload)
        except FrameError as exc:
            log.error("local channel %s: %s; closing it", self.name, exc)
        except OSError:
            pass  # closed under it
        except Exception:
            log.exception("local channel %s: a frame could not be handled; closing it", self.name)
        finally:
            self._closed = True
            with contextlib.suppress(OSError):
                self.sock.close()
            if self.on_closed is not None:
                self.on_closed(self)


class ThreadListener:
    """Accept local channels at `path` (its directory private, the socket 0600) on a thread; each
    accepted connection of this user's gets `hello` as its first frame and a reading thread."""

    def __init__(self, path: Path, hello: bytes, on_frame: Callable[[ThreadChannel, int, bytes], None]) -> None:
        self.path = path
        self.hello = hello
        self.on_frame = on_frame
        self.channels: set[ThreadChannel] = set()
        self._lock = threading.Lock()
        private_directory(path.parent)
        path.unlink(missing_ok=True)  # a socket file left by a killed process of the same name
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._server.bind(str(path))
            os.chmod(path, 0o600)
            self._server.listen(64)
        except OSError:
            self._server.close()
            raise
        self._stopped = False
        self._acceptor = threading.Thread(target=self._accept, name="shoal-channel-accept", daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                sock, _ = self._server.accept()
            except OSError:
                if self._stopped:
                    return
                continue
            if self._stopped:  # `stop`'s own wake-up
                sock.close()
                return
            try:
                if peer_uid(sock) != os.getuid():
                    log.warning("local channel: refused a process of another user")
                    sock.close()
                    continue
            except OSError:
                sock.close()
                continue
            channel = ThreadChannel(sock, self.on_frame)
            channel.on_closed = self._closed
            if not channel.send(HELLO, self.hello):  # who this is: the gateway writes nothing before
                continue
            with self._lock:
                self.channels.add(channel)
            threading.Thread(target=channel.serve, name="shoal-channel", daemon=True).start()

    def _closed(self, channel: ThreadChannel) -> None:
        with self._lock:
            self.channels.discard(channel)

    def stop(self) -> None:
        """No more connections; each channel closed (what was sent is written: `sendall` returned)."""
        self._stopped = True
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as wake:
            wake.connect(str(self.path))  # a blocked `accept` returns, sees the stop and ends
        self._acceptor.join(5)
        with contextlib.suppress(OSError):
            self._server.close()
        with self._lock:
            channels = list(self.channels)
            self.channels.clear()
        for channel in channels:
            channel.on_closed = None
            channel.close()

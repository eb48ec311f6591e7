"""A worker's end of the local channels (docs/design.md §9): batches from the gateways of its host
over a Unix socket, their completions back on the same connection.

The socket lives in a directory of this process's own (a `scratch` directory: 0700, removed at
stop, swept by the next worker after a crash), and the worker names it in every credit it grants
(`InstanceFree.local`) over the authenticated bus: a gateway opens only what a worker advertised,
and `shared.bus.local_channel` closes on a process of another user. NATS stays open for batches
too: a gateway without a channel (another host, the channel off, not open yet) sends them there.

In a python model's instance process the channel is read on plain threads instead
(`shared.bus.thread_channel`, the hot loop of docs/design.md §9): `here` runs a batch on the reading
thread when it can, and every other batch goes to the event loop's `on_batch` as before.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from shared.bus import local_channel
from shared.bus.local_channel import Channel, FrameSink
from shared.bus.thread_channel import ThreadChannel, ThreadListener
from shared.process import scratch
from shared.wire.channel_frames import BATCH, HELLO

log = logging.getLogger("shoal.worker")


class ChannelListener:
    def __init__(
        self,
        worker_id: str,
        host: str,
        on_batch: Callable[[bytes, FrameSink], None],
        runtime_dir: str = "",
        here: Callable[[bytes, FrameSink], bool] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.host = host
        # where the socket's directory goes: the runtime directory (shoal serve's private one, or a
        # volume compose shares between the gateway's and the workers' containers), else /tmp
        self.parent = Path(runtime_dir) if runtime_dir else None
        self.on_batch = on_batch
        # the hot loop: called on a channel's reading thread, True when it ran the batch there
        self.here = here
        self._threads: ThreadListener | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.directory: Path | None = None
        self.advertisement = ""  # "" until it listens: the credits name no channel
        self._server: asyncio.AbstractServer | None = None
        self._channels: set[Channel] = set()

    async def start(self) -> bool:
        """Listen; False (logged) when it cannot, and the worker takes its batches over NATS only."""
        try:
            if self.parent is not None:
                local_channel.private_directory(self.parent)  # a fresh volume is root's 0755
            self.directory = scratch.make(local_channel.DIRECTORY, parent=self.parent)  # 0700 from the start
            path = self.directory / local_channel.SOCKET
            if self.here is not None:
                self._loop = asyncio.get_running_loop()
                self._threads = ThreadListener(path, self.worker_id.encode(), self._thread_frame)
            else:
                self._server = await local_channel.listen(path, self._frame, self._channels.discard, self._opened)
        except OSError as exc:  # e.g. a $TMPDIR too long for a socket's path (108 bytes)
            log.warning("no local channel (%s): batches come over NATS only", exc)
            self._remove_directory()
            return False
        self.advertisement = local_channel.advertised(self.host, path)
        return True

    @property
    def path(self) -> str:
        return self.advertisement.partition("|")[2]

    def _opened(self, channel: Channel) -> None:
        self._channels.add(channel)
        channel.send(HELLO, self.worker_id.encode())  # who this is: the gateway writes nothing before

    def _frame(self, channel: Channel, kind: int, payload: bytes) -> None:
        if kind == BATCH:
            self.on_batch(payload, channel)
        else:
            log.error("local channel: a frame of kind %d has no business here; closing it", kind)
            channel.close()

    def _thread_frame(self, channel: ThreadChannel, kind: int, payload: bytes) -> None:
        """On a channel's reading thread: the batch runs here, or goes to the event loop."""
        if kind != BATCH:
            log.error("local channel: a frame of kind %d has no business here; closing it", kind)
            channel.close()
            return
        assert self.here is not None and self._loop is not None
        if not self.here(payload, channel):
            self._loop.call_soon_threadsafe(self.on_batch, payload, channel)

    async def stop(self) -> None:
        """Stop taking connections; close each channel once what it was sent is written."""
        for channel in list(self._channels):
            channel.on_closed = None
            channel.close()
        self._channels.clear()
        if self._threads is not None:
            self._threads.stop()
        if self._server is not None:
            self._server.close()
        self._remove_directory()

    def _remove_directory(self) -> None:
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

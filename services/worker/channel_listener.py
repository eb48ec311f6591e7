"""A worker's end of the local channels (docs/design.md §9): batches from the gateways of its host
over a Unix socket, their completions back on the same connection.

The socket lives in a directory of this process's own (a `scratch` directory: 0700, removed at
stop, swept by the next worker after a crash), and the worker names it in every credit it grants
(`InstanceFree.local`) over the authenticated bus: a gateway opens only what a worker advertised,
and `shared.bus.local_channel` closes on a process of another user. NATS stays open for batches
too: a gateway without a channel (another host, the channel off, not open yet) sends them there.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable

from shared.bus import local_channel
from shared.bus.local_channel import Channel
from shared.process import scratch
from shared.wire.channel_frames import BATCH

log = logging.getLogger("shoal.worker")

SOCKET = "worker.sock"


class ChannelListener:
    def __init__(self, host: str, on_batch: Callable[[bytes, Channel], None]) -> None:
        self.on_batch = on_batch
        self.directory = scratch.make("shoal-channel")  # private (0700) from the start
        self.path = self.directory / SOCKET
        self.advertisement = local_channel.advertised(host, self.path)
        self._server: asyncio.AbstractServer | None = None
        self._channels: set[Channel] = set()

    async def start(self) -> None:
        self._server = await local_channel.listen(self.path, self._frame, self._channels.discard)

    def _frame(self, channel: Channel, kind: int, payload: bytes) -> None:
        self._channels.add(channel)  # known once it speaks: closed at stop
        if kind == BATCH:
            self.on_batch(payload, channel)
        else:
            log.error("local channel: a frame of kind %d has no business here; closing it", kind)
            channel.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for channel in list(self._channels):
            channel.close()
        shutil.rmtree(self.directory, ignore_errors=True)

"""The local channels of a scheduler co-hosted in a gateway: batches to the workers of this host
without nats-server (docs/design.md §9).

A worker names its channel in each credit it grants (`InstanceFree.local`). `send` writes a batch
on that worker's channel when it is open, and otherwise starts opening it and says no: the batch
then goes over NATS, as every batch did before the channel, so the channel is only ever a faster
road to the same place. A worker on another host (another host token) is never tried; a socket
that cannot be opened (a container without the shared runtime directory, say) is tried again only
after `RETRY_S`. A channel that closes was most often a worker that died: `on_closed(worker)` lets
the scheduler ask NATS about it at once instead of at its next probe, and a worker still alive for
the batches it holds (frames written as the channel closed may never have been read).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from services.scheduler.scheduling_records import Slot
from shared.bus import local_channel
from shared.bus.local_channel import Channel
from shared.wire.channel_frames import BATCH, DONE

log = logging.getLogger("shoal.scheduler")

RETRY_S = 5.0  # a socket that could not be opened is left alone this long
CONNECT_TIMEOUT_S = 2.0


class WorkerChannels:
    def __init__(
        self,
        host: str,
        on_done: Callable[[bytes], None],
        on_closed: Callable[[str], None],
    ) -> None:
        self.host = host  # this process's host token (shared/bus/tensor_store.py)
        self.on_done = on_done  # a BatchDone read from a channel
        self.on_closed = on_closed  # a worker's channel closed
        self._open: dict[str, Channel] = {}  # advertisement -> its open channel
        self._opening: dict[str, asyncio.Task[None]] = {}
        self._failed: dict[str, float] = {}  # advertisement -> when it last could not be opened

    def send(self, slot: Slot, payload: bytes) -> bool:
        """Write a batch on its worker's channel; False: not open (yet), send it over NATS."""
        channel = self._open.get(slot.local)
        if channel is not None and channel.send(BATCH, payload):
            return True
        if slot.local and slot.local not in self._opening:
            self._open_soon(slot.worker, slot.local)
        return False

    def _open_soon(self, worker: str, advertisement: str) -> None:
        path = local_channel.reachable(advertisement, self.host)
        if not path:  # another host's worker: NATS is the way there
            return
        now = time.monotonic()
        failed = self._failed.get(advertisement)
        if failed is not None and now - failed < RETRY_S:
            return
        for stale in [a for a, when in self._failed.items() if now - when > RETRY_S]:
            del self._failed[stale]  # workers come and go, each with a new socket: keep only the recent
        self._opening[advertisement] = asyncio.get_running_loop().create_task(
            self._open_one(advertisement, path, worker)
        )

    async def _open_one(self, advertisement: str, path: str, worker: str) -> None:
        try:
            channel = await local_channel.connect(
                path, worker, self._frame, lambda c: self._closed(advertisement, c), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            if advertisement not in self._failed:
                log.warning("no local channel to worker %s (%s): its batches go over NATS", worker, exc)
            self._failed[advertisement] = time.monotonic()
            return
        finally:
            self._opening.pop(advertisement, None)
        self._failed.pop(advertisement, None)
        self._open[advertisement] = channel
        log.debug("local channel to worker %s open", worker)

    def _frame(self, channel: Channel, kind: int, payload: bytes) -> None:
        if kind == DONE:
            self.on_done(payload)
        else:
            log.error("local channel %s: a frame of kind %d has no business here; closing it", channel.name, kind)
            channel.close()

    def _closed(self, advertisement: str, channel: Channel) -> None:
        if self._open.get(advertisement) is channel:
            del self._open[advertisement]
        self.on_closed(channel.name)

    def close(self) -> None:
        for task in self._opening.values():
            task.cancel()
        for channel in list(self._open.values()):
            channel.on_closed = None  # ours to close: not a sign of the worker's death
            channel.close()
        self._open.clear()

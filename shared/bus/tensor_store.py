"""Tensor transport: inline bytes, POSIX shared memory, or chunks over the bus.

Every process that produces large tensors (gateways for inputs, workers for
outputs) has one `TensorStore`. Small tensors ride inline in the message. Large
ones go into a `/dev/shm` segment (same host) or stay in the producer's memory
(`transport="bus"`, or when the consumer is on another host) and are fetched in
chunks below the server's `max_payload` from the producer's tensor subject.

Ownership: input segments belong to the gateway that made them and are freed when
the response is delivered or the request dies. Output segments are handed to the
consumer (the gateway), which unlinks them after reading. Bus-held tensors are
freed on a `release` message or when their deadline passes.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Literal

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from shared.bus import connection
from shared.memory.segments import create_segment, host_token, map_segment, unlink_segment
from shared.wire import subjects
from shared.wire.messages import ChunkRequest, TensorRef

log = logging.getLogger(__name__)

Transport = Literal["auto", "shm", "bus"]
_FETCH_WINDOW = 8
INLINE_BUDGET = 256 * 1024  # inline output bytes per response: many responses fit one bus message


_chunk_decoder = msgspec.msgpack.Decoder(ChunkRequest)


@dataclass
class _Held:
    data: memoryview | None  # bus-held bytes, or None for a shared-memory segment
    segment: str
    expires: float


class TensorStore:
    def __init__(
        self,
        nc: NATS,
        owner_id: str,
        inline_max: int = 65536,
        transport: Transport = "auto",
    ) -> None:
        self._nc = nc
        self.owner = subjects.tensor_owner(owner_id)
        self.inline_max = inline_max
        self.transport = transport
        self.host = host_token() if transport != "bus" else f"bus-{owner_id}"
        self._held: dict[str, _Held] = {}
        self._sub: Subscription | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Serve this store's tensors; returns once the server knows the subscription, so that a
        consumer on another connection asking at once finds it (not NATS "no responders": the SUB
        could still wait in this connection's buffer while the other one's request arrives)."""
        self._sub = await self._nc.subscribe(self.owner, cb=self._serve)
        await connection.settled(self._nc)
        self._sweeper = asyncio.create_task(self._sweep())

    async def close(self) -> None:
        if self._sweeper:
            self._sweeper.cancel()
        if self._sub:
            await self._sub.unsubscribe()
        self._drop(list(self._held))

    # -- producing -------------------------------------------------------
    def put(
        self,
        name: str,
        datatype: str,
        shape: list[int],
        payload: memoryview | bytes,
        ttl_s: float,
        inline: bool = True,
    ) -> TensorRef:
        """`inline=False`: out of line even when small (the message's inline budget is spent)."""
        nbytes = memoryview(payload).nbytes
        if inline and nbytes <= self.inline_max:
            return TensorRef(name, datatype, shape, data=bytes(payload))
        expires = time.monotonic() + ttl_s
        if self.transport != "bus":
            # Also served over the bus (key = segment) for a consumer on another host.
            try:
                segment = create_segment(payload)
            except OSError as exc:  # /dev/shm full: keep it in memory and serve it over the bus
                log.warning("shared memory unavailable (%s); tensor '%s' goes over the bus", exc, name)
                return self._hold(name, datatype, shape, payload, expires)
            self._held[segment] = _Held(None, segment, expires)
            return TensorRef(
                name,
                datatype,
                shape,
                shm=segment,
                nbytes=nbytes,
                host=self.host,
                owner=self.owner,
                key=segment,
            )
        return self._hold(name, datatype, shape, payload, expires)

    def _hold(
        self, name: str, datatype: str, shape: list[int], payload: bytes | bytearray | memoryview, expires: float
    ) -> TensorRef:
        key = uuid.uuid4().hex
        self._held[key] = _Held(memoryview(payload).cast("B"), "", expires)
        return TensorRef(name, datatype, shape, nbytes=memoryview(payload).nbytes, owner=self.owner, key=key)

    def free(self, refs: list[TensorRef]) -> None:
        """Free tensors this process produced (or was handed) and no longer needs."""
        for ref in refs:
            if ref.borrowed:
                continue  # the client's region: it is the client's to free
            if ref.shm:
                unlink_segment(ref.shm)
            if ref.key:
                self._held.pop(ref.key, None)

    # -- consuming -------------------------------------------------------
    async def get(self, ref: TensorRef, timeout: float) -> memoryview | bytes:
        if ref.data is not None:
            return ref.data
        if ref.cuda_handle:
            from shared.memory import cuda_shm

            return cuda_shm.read(ref.cuda_handle, ref.device_id, ref.offset, ref.nbytes)
        if ref.shm and ref.host == self.host:
            return map_segment(ref.shm, ref.offset, ref.nbytes)
        if not ref.key:
            raise RuntimeError(f"tensor '{ref.name}' is in shared memory on another host")
        return await self._fetch(ref, timeout)

    async def release_remote(self, refs: list[TensorRef]) -> None:
        """Tell owners that bus-held tensors were consumed; unlink handed-over segments."""
        by_owner: dict[str, list[str]] = {}
        for ref in refs:
            if ref.borrowed or ref.in_region:
                continue
            if ref.shm and ref.host == self.host:
                unlink_segment(ref.shm)
            elif ref.key:
                by_owner.setdefault(ref.owner, []).append(ref.key)
        for owner, keys in by_owner.items():
            await self._nc.publish(owner, msgspec.msgpack.encode(ChunkRequest("release", keys)))

    async def _fetch(self, ref: TensorRef, timeout: float) -> memoryview:
        chunk = max(1024, self._nc.max_payload - 4096)
        out = bytearray(ref.nbytes)
        view = memoryview(out)
        limiter = asyncio.Semaphore(_FETCH_WINDOW)

        async def one(offset: int) -> None:
            size = min(chunk, ref.nbytes - offset)
            request = msgspec.msgpack.encode(ChunkRequest("get", [ref.key], offset, size))
            async with limiter:
                reply = await self._nc.request(ref.owner, request, timeout=timeout)
            if reply.headers and reply.headers.get("error"):
                raise RuntimeError(f"tensor '{ref.name}': {reply.headers['error']}")
            if len(reply.data) != size:
                raise RuntimeError(f"tensor '{ref.name}': short chunk at {offset}")
            view[offset : offset + size] = reply.data

        await asyncio.gather(*(one(o) for o in range(0, ref.nbytes, chunk)))
        return view

    async def _serve(self, msg: Msg) -> None:
        request: ChunkRequest | None = connection.decode(_chunk_decoder, msg, log)
        if request is None:
            return
        if request.op == "release":
            self._drop(request.keys)
            return
        held = self._held.get(request.keys[0]) if request.keys else None
        if held is None:
            await self._nc.publish(msg.reply, b"", headers={"error": "tensor not found (released or expired)"})
            return
        if held.data is not None:
            data = held.data
        else:
            data = map_segment(held.segment, request.offset, request.size)
            request.offset = 0
        await self._nc.publish(msg.reply, bytes(data[request.offset : request.offset + request.size]))

    def _drop(self, keys: list[str]) -> None:
        for key in keys:
            held = self._held.pop(key, None)
            if held is not None and held.segment:
                unlink_segment(held.segment)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            self._drop([k for k, h in list(self._held.items()) if h.expires < now])  # the hot loop adds from its thread

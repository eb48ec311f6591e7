"""Client shared-memory regions (system and CUDA), registered through any gateway.

Registrations live in a JetStream KV bucket so every gateway sees them; the worker
reads inputs from and writes outputs into a region directly. Error texts and status
codes follow Triton's (docs/triton-spec.md §1.11).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
import stat
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.js.errors import KeyWrongLastSequenceError

from shared.bus import buckets
from shared.errors import Code, ShoalError, internal, invalid, not_found, unsupported
from shared.wire import subjects
from shared.wire.messages import TensorRef, encode
from shared.wire.records import ShmRegion

log = logging.getLogger(__name__)
# An unregistered region's delete marker leaves the bucket after MARKER_KEEP_S (every gateway sweeps
# every MARKER_SWEEP_S): a client that names each region anew (a uuid) grew the bucket by one marker
# per region for ever (benchmarks/soak_resources.py). A gateway whose watch starts again after being
# away longer than that would not see those deletes.
MARKER_KEEP_S = 600.0
MARKER_SWEEP_S = 300.0
DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
_decoder = msgspec.msgpack.Decoder(ShmRegion)


TRITON_RESERVED_PREFIX = "triton_python_backend_shm_region_"  # Triton's python backend's own regions
_SHOAL_PREFIXES = ("shoal_", "shoal-")  # Shoal's tensor segments: another client's data
_UINT64_MAX = 2**64 - 1


def check_key(name: str, key: str) -> None:
    """Triton's ValidateSharedMemoryKey (`src/common.cc`), then a POSIX shm name as glibc's
    shm_open takes it: leading '/'s dropped, no other '/', not '.'/'..'.

    Anything else could name a file outside /dev/shm (Triton's shm_open fails on it: its text);
    Shoal's own segments are refused too, so a client cannot read or write another client's tensors.
    """
    bare = key.lstrip("/")
    if not bare:
        raise invalid(f"cannot register shared memory region '{name}' - invalid shm key '{key}'")
    if bare.startswith(TRITON_RESERVED_PREFIX):
        raise invalid(
            f"cannot register shared memory region '{name}' with key '{key}' as the key contains the reserved "
            f"prefix '{TRITON_RESERVED_PREFIX}'"
        )
    if "/" in bare or bare in (".", "..") or "\0" in bare:
        raise internal(f"Unable to open shared memory region: '{key}'")
    if bare.startswith(_SHOAL_PREFIXES):
        raise invalid(f"cannot register shared memory region '{name}' with key '{key}': the key is reserved")


def segment_size(name: str, key: str) -> int:
    """The size of the segment `key` names, opened as Triton's shm_open does (read and write, as
    the gateway's user: a segment that user may not open is refused here, not at the first
    request). A symbolic link, or a segment with another name too (a hard link: perhaps to a
    segment of Shoal's own under a name that passes `check_key`), is refused."""
    try:
        fd = os.open(f"/dev/shm/{key.lstrip('/')}", os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        raise internal(f"Unable to open shared memory region: '{key}'") from None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode):
        raise internal(f"Unable to open shared memory region: '{key}'")
    if info.st_nlink != 1:
        raise invalid(
            f"cannot register shared memory region '{name}' with key '{key}': the segment has {info.st_nlink} names"
        )
    return info.st_size


class ShmRegistry:
    def __init__(self, nc: NATS, host: str, enabled: bool) -> None:
        self.nc = nc
        self.host = host
        self.enabled = enabled
        self.regions: dict[str, ShmRegion] = {}
        self._tasks: list[asyncio.Task[None]] = []
        # Triton lets requests in flight finish with a region that is unregistered meanwhile:
        # it stays listed and usable until the last of them ends, then goes.
        self._in_use: dict[str, int] = {}
        self._doomed: set[str] = set()

    async def start(self) -> None:
        self.kv = await buckets.bucket(self.nc, subjects.SHM_BUCKET)
        self._tasks = [asyncio.create_task(self._watch()), asyncio.create_task(self._sweep())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()

    async def _watch(self) -> None:
        async for change in buckets.watch(self.nc, self.kv):
            if not change.key:
                continue
            name = subjects.untoken(change.key)
            if change.value is None:
                self.regions.pop(name, None)
            else:
                self.regions[name] = _decoder.decode(change.value)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(MARKER_SWEEP_S)
            try:
                swept = await buckets.purge_old_markers(self.kv, MARKER_KEEP_S)
            except Exception as exc:  # the bus away, or the stream without a leader: next time
                log.debug("sweeping the shm regions' delete markers: %s", exc)
                continue
            if swept:
                log.debug("swept %d delete markers of unregistered shm regions", swept)

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise unsupported(DISABLED)

    async def _store(self, region: ShmRegion) -> None:
        try:
            await self.kv.create(subjects.model_key(region.name), encode(region))
        except KeyWrongLastSequenceError:
            raise ShoalError(f"shared memory region '{region.name}' already in manager", Code.ALREADY_EXISTS) from None
        self.regions[region.name] = region

    # -- system ---------------------------------------------------------------------
    async def register_system(self, name: str, body: dict[str, Any]) -> None:
        self._check_enabled()
        key, offset, byte_size = body.get("key"), body.get("offset", 0), body.get("byte_size")
        if not isinstance(key, str):
            raise invalid("Shared memory register request has no 'key' field")
        if not isinstance(byte_size, int) or isinstance(byte_size, bool):
            raise invalid("Shared memory register request has no 'byte_size' field")
        if not isinstance(offset, int) or offset < 0 or byte_size < 0 or offset + byte_size > _UINT64_MAX:
            raise invalid(f"failed to register shared memory region '{name}': invalid args")
        check_key(name, key)
        if name in self.regions:
            raise ShoalError(f"shared memory region '{name}' already in manager", Code.ALREADY_EXISTS)
        size = segment_size(name, key)
        if offset + byte_size > size:
            raise invalid(f"failed to register shared memory region '{name}': invalid args")
        await self._store(ShmRegion(name, "system", byte_size, key=key, offset=offset, host=self.host))

    def status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        if name:
            region = self.regions.get(name)
            if region is None:
                raise not_found(f"Unable to find {kind} shared memory region: '{name}'")
            if region.kind != kind:
                raise not_found(
                    f"The region named '{name}' is registered as {region.kind} shared memory, not {kind} shared memory"
                )
            regions = [region]
        else:
            regions = [r for r in self.regions.values() if r.kind == kind]
        if kind == "system":
            return [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in regions]
        return [{"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in regions]

    async def unregister(self, kind: str, name: str = "") -> None:
        self._check_enabled()
        names = [name] if name else [n for n, r in self.regions.items() if r.kind == kind]
        for each in names:
            region = self.regions.get(each)
            if region is None or region.kind != kind:
                continue  # unknown names are fine, as in Triton
            if self._in_use.get(each):
                self._doomed.add(each)
                continue
            await self._delete(each)

    async def _delete(self, name: str) -> None:
        self.regions.pop(name, None)
        await self.kv.delete(subjects.model_key(name))

    def hold(self, names: list[str]) -> None:
        """Requests in flight use these regions (see `unregister`)."""
        for name in names:
            self._in_use[name] = self._in_use.get(name, 0) + 1

    async def release(self, names: list[str]) -> None:
        for name in names:
            left = self._in_use.get(name, 0) - 1
            if left > 0:
                self._in_use[name] = left
                continue
            self._in_use.pop(name, None)
            if name in self._doomed:
                self._doomed.discard(name)
                await self._delete(name)

    # -- CUDA -----------------------------------------------------------------------------
    async def register_cuda(self, name: str, body: dict[str, Any]) -> None:
        self._check_enabled()
        raw = body.get("raw_handle")
        byte_size, device_id = body.get("byte_size"), body.get("device_id", 0)
        if not isinstance(raw, dict) or not isinstance(raw.get("b64"), str):
            raise invalid("Shared memory register request has no 'raw_handle' field")
        if not isinstance(byte_size, int) or not isinstance(device_id, int):
            raise invalid(f"failed to register CUDA shared memory region '{name}': invalid args")
        try:
            handle = base64.b64decode(raw["b64"], validate=True)
        except (binascii.Error, ValueError):
            handle = b""
        from shared.memory import cuda_shm

        if len(handle) != cuda_shm.HANDLE_SIZE:
            raise invalid("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
        if name in self.regions:
            raise ShoalError(f"shared memory region '{name}' already in manager", Code.ALREADY_EXISTS)
        try:
            cuda_shm.open_handle(handle, device_id)  # proves the handle is usable here
        except ShoalError as exc:
            if exc.code == Code.INTERNAL:  # CUDA refused the handle: Triton's wording, its status
                raise ShoalError(
                    f"failed to register CUDA shared memory region '{name}': {exc.message}", exc.code
                ) from None
            raise invalid(f"failed to register CUDA shared memory region: '{name}', {exc.message}") from None
        await self._store(ShmRegion(name, "cuda", byte_size, cuda_handle=handle, device_id=device_id))

    # -- use in inference ---------------------------------------------------------------------
    def reference(self, tensor_name: str, datatype: str, shape: list[int], params: dict[str, Any]) -> TensorRef:
        """A tensor inside a registered region, bounds checked (inputs and output destinations)."""
        self._check_enabled()
        name = params.get("shared_memory_region")
        size = params.get("shared_memory_byte_size")
        offset = params.get("shared_memory_offset", 0)
        if not isinstance(name, str):
            raise invalid(f"'shared_memory_region' of '{tensor_name}' must be a string")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise invalid(f"'shared_memory_byte_size' of '{tensor_name}' must be given with 'shared_memory_region'")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise invalid(f"'shared_memory_offset' of '{tensor_name}' must be a non-negative integer")
        region = self.regions.get(name)
        if region is None:
            raise not_found(f"Unable to find shared memory region: '{name}'")
        if offset >= region.byte_size and not (offset == 0 and size == 0):
            raise invalid(f"Invalid offset for shared memory region: '{name}'")
        if offset + size > _UINT64_MAX:  # Triton's uint64 arithmetic would wrap: it says so
            raise invalid(
                f"Integer overflow detected: byte_size {size} + offset {offset} overflows for shared memory "
                f"region: '{name}'"
            )
        if offset + size > region.byte_size:
            raise invalid(f"Invalid offset + byte size for shared memory region: '{name}'")
        if region.kind == "system" and region.host != self.host:
            raise invalid(f"shared memory region '{name}' was registered on another host; register it on this one")
        if region.kind == "cuda":
            return TensorRef(
                tensor_name,
                datatype,
                shape,
                nbytes=size,
                offset=offset,
                borrowed=True,
                cuda_handle=region.cuda_handle,
                device_id=region.device_id,
            )
        return TensorRef(
            tensor_name,
            datatype,
            shape,
            shm=region.key,
            offset=region.offset + offset,
            nbytes=size,
            host=region.host,
            borrowed=True,
        )

"""Triton's response cache (`--cache-config local,size=N` or `redis,host=H,port=P`,
`response_cache { enable: true }`).

`local` is a bounded LRU per gateway; `redis` is `inference/redis_cache.py`. The key covers the model, version, every input's name, datatype,
shape and bytes, the requested outputs and the custom parameters, so two requests whose
bytes match but whose shapes differ never collide (Triton keys on bytes without shapes).
Requests with inputs or outputs in client shared memory bypass it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import msgspec

from inference.types import OutputTensor, ParsedRequest
from inference.validation import Validated


@dataclass(frozen=True)
class CachedOutput:
    name: str
    datatype: str
    shape: list[int]
    data: bytes

    @property
    def nbytes(self) -> int:
        return len(self.data)


class Cache(Protocol):
    """Where cached responses live: this gateway's memory (`ResponseCache`) or a Redis server
    every gateway shares (`inference/redis_cache.py`)."""

    async def get(self, key: bytes) -> list[CachedOutput] | None: ...
    async def put(self, key: bytes, outputs: list[OutputTensor]) -> None: ...


def cache_key(model: str, version: int, parsed: ParsedRequest, valid: Validated) -> bytes | None:
    """The request's identity, or None when it cannot be cached."""
    if any(t.in_shared_memory for t in parsed.inputs) or any(o.in_shared_memory for o in parsed.outputs or []):
        return None
    digest = hashlib.blake2b(digest_size=32)
    custom = {k: v for k, v in parsed.parameters.items() if k != "binary_data_output"}
    digest.update(msgspec.msgpack.encode([model, version, sorted(valid.outputs), sorted(custom.items())]))
    for tensor in sorted(parsed.inputs, key=lambda t: t.name):
        if tensor.data is None:  # in shared memory (refused above)
            return None
        digest.update(
            msgspec.msgpack.encode([tensor.name, tensor.datatype, tensor.shape, memoryview(tensor.data).nbytes])
        )
        digest.update(tensor.data)
    return digest.digest()


class ResponseCache:
    """Triton's `local` cache: a bounded LRU in this gateway's memory."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[bytes, list[CachedOutput]] = OrderedDict()

    async def get(self, key: bytes) -> list[CachedOutput] | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    async def put(self, key: bytes, outputs: list[OutputTensor]) -> None:
        entry = [CachedOutput(o.name, o.datatype, list(o.shape), bytes(o.data)) for o in outputs if o.data is not None]
        size = sum(o.nbytes for o in entry)
        if size > self.max_bytes or key in self._entries:
            return
        while self.bytes + size > self.max_bytes and self._entries:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= sum(o.nbytes for o in evicted)
        self._entries[key] = entry
        self.bytes += size

    def __len__(self) -> int:
        return len(self._entries)

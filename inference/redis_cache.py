"""Triton's Redis response cache (`--cache-config redis,host=H --cache-config redis,port=P`,
the options of triton-inference-server/redis_cache's README): every gateway shares one cache.

Entries are MessagePack under `shoal:cache:<key>` (Triton's cache values are its own; no client
reads them). Redis evicts as its `maxmemory-policy` says. A Redis that cannot be reached makes a
lookup a miss and an insert a no-op, logged once a minute: the request is served either way, as
Triton's cache only ever costs a lookup.
"""

from __future__ import annotations

import logging
import os
import time

import msgspec

from inference.cache import CachedOutput
from inference.types import OutputTensor

log = logging.getLogger("shoal.gateway")

OPTIONS = ("host", "port", "user", "password", "db", "connect_timeout", "socket_timeout", "pool_size", "wait_timeout")
_PREFIX = b"shoal:cache:"
_Entry = list[tuple[str, str, list[int], bytes]]


def parse_options(entries: list[str]) -> dict[str, str]:
    """`key=value` settings of the redis cache; host and port are required (ValueError: why)."""
    options: dict[str, str] = {}
    for entry in entries:
        key, eq, value = entry.partition("=")
        if not eq or key not in OPTIONS:
            raise ValueError(f"--cache-config redis: unknown setting '{entry}' (one of {', '.join(OPTIONS)})")
        options[key] = value
    for required in ("host", "port"):
        if required not in options:
            raise ValueError(f"--cache-config redis: '{required}' is required")
    return options


class RedisCache:
    def __init__(self, options: dict[str, str]) -> None:
        import redis.asyncio as redis  # the `redis` extra

        def ms(name: str, default: str) -> float | None:
            value = int(options.get(name, default))
            return value / 1000 if value else None  # 0: wait forever, as the README says

        pool = redis.BlockingConnectionPool(
            host=options["host"],
            port=int(options["port"]),
            db=int(options.get("db", "0")),
            username=options.get("user") or os.environ.get("TRITONCACHE_REDIS_USERNAME") or None,
            password=options.get("password") or os.environ.get("TRITONCACHE_REDIS_PASSWORD") or None,
            socket_connect_timeout=ms("connect_timeout", "0"),
            socket_timeout=ms("socket_timeout", "0"),
            max_connections=int(options.get("pool_size", "1")),
            timeout=ms("wait_timeout", "1000"),
        )
        self.client = redis.Redis(connection_pool=pool)
        self._encode = msgspec.msgpack.Encoder().encode
        self._decode = msgspec.msgpack.Decoder(_Entry).decode
        self._warned = 0.0

    async def get(self, key: bytes) -> list[CachedOutput] | None:
        try:
            raw = await self.client.get(_PREFIX + key)
        except Exception as exc:
            self._unreachable(exc)
            return None
        if not isinstance(raw, bytes):  # None: a miss
            return None
        return [CachedOutput(name, datatype, shape, data) for name, datatype, shape, data in self._decode(raw)]

    async def put(self, key: bytes, outputs: list[OutputTensor]) -> None:
        entry = [(o.name, o.datatype, list(o.shape), bytes(o.data)) for o in outputs if o.data is not None]
        try:
            await self.client.set(_PREFIX + key, self._encode(entry))
        except Exception as exc:
            self._unreachable(exc)

    def _unreachable(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._warned > 60:
            self._warned = now
            log.warning("the redis response cache is unreachable (requests are served without it): %s", exc)

    async def close(self) -> None:
        await self.client.aclose()

"""The model's control plane over HTTP: its config, and loads with a config override (explicit mode)."""

from __future__ import annotations

import aiohttp
import orjson

from shoal.perf.options import PerfError


class Repository:
    def __init__(self, url: str, model: str, timeout_s: float = 300.0) -> None:
        base = url if url.startswith(("http://", "https://")) else f"http://{url}"
        self.base, self.model = base.rstrip("/"), model
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))

    async def _call(self, method: str, path: str, payload: dict | None = None) -> dict:
        data = orjson.dumps(payload) if payload is not None else None
        try:
            async with self.session.request(method, self.base + path, data=data) as resp:
                body = await resp.read()
        except aiohttp.ClientError as exc:
            raise PerfError(f"cannot reach {self.base}: {exc}") from None
        answer = orjson.loads(body) if body else {}
        if resp.status != 200:
            error = answer.get("error", body[:300].decode(errors="replace")) if isinstance(answer, dict) else answer
            raise PerfError(f"{method} {path}: {resp.status}: {error}")
        return answer

    async def config(self) -> dict:
        return await self._call("GET", f"/v2/models/{self.model}/config")

    async def load(self, config: dict | None = None) -> None:
        """Load (or reload) the model: from the repository, or with `config` as Triton's config override."""
        payload = {"parameters": {"config": orjson.dumps(config).decode()}} if config is not None else {}
        await self._call("POST", f"/v2/repository/models/{self.model}/load", payload)

    async def close(self) -> None:
        await self.session.close()

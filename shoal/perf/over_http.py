"""KServe v2 over HTTP with aiohttp (what tritonclient.http.aio uses), binary tensor extension.

One pooled session for the whole run (connections are reused, never one per request); request bodies are
encoded once in `prepare`.
"""

from __future__ import annotations

import time

import aiohttp
import orjson

from shoal.perf.inputs import ModelInfo, Step, TensorSpec
from shoal.perf.measure import Record
from shoal.perf.options import PerfError


def encode_step(step: Step) -> tuple[bytes, dict[str, str]]:
    """The binary-extension body of one request: JSON header, then the raw tensors in order."""
    inputs, raw = [], []
    for t in step.inputs:
        entry: dict = {"name": t.name, "shape": t.shape, "datatype": t.datatype}
        ref = step.input_shm.get(t.name)
        if ref is not None:
            entry["parameters"] = {
                "shared_memory_region": ref.region,
                "shared_memory_byte_size": ref.byte_size,
                "shared_memory_offset": ref.offset,
            }
        else:
            entry["parameters"] = {"binary_data_size": len(t.data)}
            raw.append(t.data)
        inputs.append(entry)
    outputs = []
    for name in step.outputs:
        ref = step.output_shm.get(name)
        params: dict = {"binary_data": True}
        if ref is not None:
            params = {"shared_memory_region": ref.region, "shared_memory_byte_size": ref.byte_size}
        outputs.append({"name": name, "parameters": params})
    header = orjson.dumps({"inputs": inputs, "outputs": outputs})
    if not raw:
        return header, {"Content-Type": "application/json"}
    return header + b"".join(raw), {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }


def _error_text(status: int, body: bytes) -> str:
    try:
        return f"{status}: {orjson.loads(body)['error']}"
    except (ValueError, KeyError, TypeError):
        return f"{status}: {body[:500].decode(errors='replace')}"


class HttpTransport:
    def __init__(self, url: str, model: str, version: str, timeout_s: float) -> None:
        base = url if url.startswith(("http://", "https://")) else f"http://{url}"
        self.base = base.rstrip("/")
        self.model_path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
        self.model, self.version = model, version
        # limit=0: as many connections as requests in flight (one per concurrent request, reused)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            skip_auto_headers=("User-Agent",),
        )
        self.bodies: list[tuple[bytes, dict[str, str]]] = []

    async def _get(self, path: str) -> dict:
        try:
            async with self.session.get(self.base + path) as resp:
                body = await resp.read()
        except aiohttp.ClientError as exc:
            raise PerfError(f"cannot reach {self.base}: {exc}") from None
        if resp.status != 200:
            raise PerfError(f"GET {path}: {_error_text(resp.status, body)}")
        return orjson.loads(body)

    async def _post(self, path: str, payload: dict) -> None:
        try:
            async with self.session.post(self.base + path, data=orjson.dumps(payload)) as resp:
                body = await resp.read()
        except aiohttp.ClientError as exc:
            raise PerfError(f"cannot reach {self.base}: {exc}") from None
        if resp.status != 200:
            raise PerfError(f"POST {path}: {_error_text(resp.status, body)}")

    async def model_info(self) -> ModelInfo:
        meta = await self._get(self.model_path)
        config = await self._get(self.model_path + "/config")

        def specs(entries: list[dict]) -> list[TensorSpec]:
            return [TensorSpec(e["name"], e["datatype"], [int(d) for d in e["shape"]]) for e in entries]

        return ModelInfo(
            self.model,
            self.version,
            int(config.get("max_batch_size", 0)),
            specs(meta.get("inputs", [])),
            specs(meta.get("outputs", [])),
        )

    def prepare(self, steps: list[Step]) -> None:
        self.bodies = [encode_step(step) for step in steps]

    async def infer(self, step: int) -> Record:
        body, headers = self.bodies[step]
        start = time.perf_counter_ns()
        try:
            async with self.session.post(self.base + self.model_path + "/infer", data=body, headers=headers) as resp:
                got_headers = time.perf_counter_ns()
                answer = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise PerfError(f"inference request failed: {exc!r}") from None
        end = time.perf_counter_ns()
        if resp.status != 200:
            raise PerfError(f"inference request failed: {_error_text(resp.status, answer)}")
        return Record(start, end, 0, end - got_headers)

    async def statistics(self) -> dict:
        return await self._get(self.model_path + "/stats")

    async def register_system_shm(self, name: str, key: str, byte_size: int) -> None:
        await self._post(
            f"/v2/systemsharedmemory/region/{name}/register", {"key": key, "offset": 0, "byte_size": byte_size}
        )

    async def unregister_system_shm(self, name: str) -> None:
        await self._post(f"/v2/systemsharedmemory/region/{name}/unregister", {})

    async def close(self) -> None:
        await self.session.close()

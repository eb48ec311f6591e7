"""What the engine needs from a protocol: one Protocol, implemented over HTTP (aiohttp) and gRPC (grpc.aio)."""

from __future__ import annotations

from typing import Protocol

from shoal.perf.inputs import ModelInfo, Step
from shoal.perf.measure import Record


class Transport(Protocol):
    async def model_info(self) -> ModelInfo: ...

    def prepare(self, steps: list[Step]) -> None:
        """Encode every step once; `infer(i)` then sends step i's bytes as they are."""

    async def infer(self, step: int) -> Record: ...

    async def statistics(self) -> dict:
        """The model's statistics in the HTTP endpoint's JSON shape (`{"model_stats": [...]}`)."""

    async def register_system_shm(self, name: str, key: str, byte_size: int) -> None: ...

    async def unregister_system_shm(self, name: str) -> None: ...

    async def close(self) -> None: ...


def open_transport(
    protocol: str, url: str, model: str, version: str, timeout_s: float, streaming: bool = False
) -> Transport:
    if streaming:
        if protocol != "grpc":
            raise ValueError("streaming is only allowed with gRPC protocol")
        from shoal.perf.over_grpc_stream import StreamingGrpcTransport

        return StreamingGrpcTransport(url, model, version, timeout_s)
    if protocol == "http":
        from shoal.perf.over_http import HttpTransport

        return HttpTransport(url, model, version, timeout_s)
    if protocol == "grpc":
        from shoal.perf.over_grpc import GrpcTransport

        return GrpcTransport(url, model, version, timeout_s)
    raise ValueError(f"unknown protocol '{protocol}' (http or grpc)")

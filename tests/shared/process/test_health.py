"""The health port of the scheduler, worker and repository (shared/process/health.py): Triton's
live and ready paths, as the Kubernetes probes (deploy/kubernetes/) ask them."""

from __future__ import annotations

import asyncio

from shared.process.health import LIVE, READY, HealthPort
from shared.process.settings import RepositorySettings, SchedulerSettings, WorkerSettings


async def _get(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer.split(b"\r\n", 1)[0]


async def test_live_always_ready_as_the_service_says() -> None:
    state = {"ready": False}
    health = HealthPort(0, lambda: state["ready"], address="127.0.0.1")
    await health.start()
    try:
        assert await _get(health.port, f"GET {LIVE} HTTP/1.1\r\nHost: x\r\n\r\n".encode()) == b"HTTP/1.1 200 OK"
        not_ready = await _get(health.port, f"GET {READY} HTTP/1.1\r\n\r\n".encode())
        assert not_ready == b"HTTP/1.1 503 Service Unavailable"
        state["ready"] = True
        assert await _get(health.port, f"GET {READY}?x=1 HTTP/1.1\r\n\r\n".encode()) == b"HTTP/1.1 200 OK"
        assert await _get(health.port, b"GET /metrics HTTP/1.1\r\n\r\n") == b"HTTP/1.1 404 Not Found"
        assert await _get(health.port, f"POST {LIVE} HTTP/1.1\r\n\r\n".encode()) == b"HTTP/1.1 405 Method Not Allowed"
    finally:
        await health.stop()


async def test_a_request_that_never_ends_is_dropped_and_the_port_still_answers() -> None:
    health = HealthPort(0, lambda: True, address="127.0.0.1")
    await health.start()
    try:
        _, idle = await asyncio.open_connection("127.0.0.1", health.port)
        idle.write(b"GET /v2/hea")  # never finished: closed after 2 s, and never holds the others up
        assert await _get(health.port, f"GET {LIVE} HTTP/1.1\r\n\r\n".encode()) == b"HTTP/1.1 200 OK"
        idle.close()
    finally:
        await health.stop()


def test_the_services_without_http_take_the_flag_and_it_is_off_by_default(monkeypatch) -> None:
    for model in (SchedulerSettings, WorkerSettings, RepositorySettings):
        assert model().health_port == 0
    monkeypatch.setenv("SHOAL_WORKER_HEALTH_PORT", "8080")
    assert WorkerSettings().health_port == 8080

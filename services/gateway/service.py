"""Running the gateway: NATS connection, model registry, HTTP and metrics listeners."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec
import uvicorn

from services.gateway.http.app import Gateway, build_app, scheduler_stats
from services.gateway.http.protocol import CorkedHttpToolsProtocol
from services.gateway.metrics.custom import CustomMetrics
from services.gateway.metrics.endpoint import MetricsOptions, build_metrics_app
from services.inference.core import InferenceCore
from services.inference.models import ModelRegistry
from services.inference.shm import ShmRegistry
from shared import bus, discovery
from shared.dispatch import Dispatcher
from shared.logsettings import follow
from shared.settings import GatewaySettings
from shared.tensors import TensorStore

log = logging.getLogger("shoal.gateway")


class _Server(uvicorn.Server):
    """Signals belong to the process (`shared.runtime`), not to each listener."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def metrics_options(settings: GatewaySettings) -> MetricsOptions:
    quantiles = tuple(
        (float(q), float(e)) for q, _, e in (p.partition(":") for p in settings.summary_quantiles.split(",") if p)
    )
    return MetricsOptions(
        settings.counter_latencies,
        settings.summary_latencies,
        settings.histogram_latencies,
        quantiles or MetricsOptions().quantiles,
        settings.allow_cpu_metrics,
        settings.allow_gpu_metrics,
    )


async def run(settings: GatewaySettings, stop: asyncio.Event) -> None:
    nc = await bus.connect(settings.nats_url, f"shoal-gateway-{settings.gateway_id}")
    await follow(nc, "gateway")
    store = TensorStore(nc, settings.gateway_id, settings.inline_max_bytes, settings.tensor_transport)
    await store.start()
    registry = ModelRegistry()
    await registry.start(nc)
    dispatcher = Dispatcher(nc, settings.gateway_id, store)
    await dispatcher.start()
    shm = ShmRegistry(nc, store.host, settings.allow_client_shm)
    await shm.start()
    gateway = Gateway(settings, nc, registry, InferenceCore(dispatcher, store, settings.request_timeout_s, shm))

    def status() -> dict:
        return {
            "http": f"{settings.http_address}:{settings.http_port}",
            "models": len(registry.records),
            "requests_in_flight": dispatcher.in_flight,
            "shm_regions": len(shm.regions),
        }

    micro = await discovery.register(
        nc,
        "gateway",
        settings.gateway_id,
        status,
        http_port=str(settings.http_port),
        metrics_port=str(settings.metrics_port),
    )

    async def metrics_stats(quantiles: list[float]) -> dict:
        return await scheduler_stats(nc, msgspec.json.encode({"quantiles": quantiles}) if quantiles else b"")

    custom = CustomMetrics()
    await custom.start(nc)

    async def custom_metrics() -> list[str]:
        return custom.lines()

    servers = [
        _Server(
            uvicorn.Config(
                build_app(gateway),
                host=settings.http_address,
                port=settings.http_port,
                http=CorkedHttpToolsProtocol,
                log_level="warning",
                access_log=False,
                timeout_graceful_shutdown=settings.exit_timeout_s,
            )
        )
    ]
    if settings.allow_metrics:
        servers.append(
            _Server(
                uvicorn.Config(
                    build_metrics_app(metrics_stats, metrics_options(settings), custom_metrics),
                    host=settings.metrics_address or settings.http_address,
                    port=settings.metrics_port,
                    log_level="warning",
                    access_log=False,
                )
            )
        )
    metrics_address = settings.metrics_address or settings.http_address
    started = log.info if settings.log_started else log.debug  # under shoal serve, the supervisor says it
    started("Started HTTPService at %s:%d", settings.http_address, settings.http_port)
    if settings.allow_metrics:
        started("Started Metrics Service at %s:%d", metrics_address, settings.metrics_port)

    async def stop_servers() -> None:
        await stop.wait()
        for server in servers:
            server.should_exit = True

    stopper = asyncio.create_task(stop_servers())
    try:
        await asyncio.gather(*(server.serve() for server in servers))
    finally:
        stopper.cancel()
        await micro.stop()
        await shm.stop()
        await registry.stop()
        await store.close()
        await nc.drain()

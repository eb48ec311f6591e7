"""Running the gateway: NATS connection, model registry, HTTP and metrics listeners."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec
import uvicorn

from inference import trace
from inference.cache import ResponseCache
from inference.core import InferenceCore
from inference.models import ModelRegistry
from inference.on_demand import DemandLoads
from inference.server import InferenceServer
from inference.shm import ShmRegistry
from inference.statistics import scheduler_stats
from services.gateway.grpc import server as grpc_server
from services.gateway.http.app import build_app
from services.gateway.http.listener import http_sockets
from services.gateway.http.protocol import CorkedHttpToolsProtocol
from services.gateway.metrics import models as model_metrics
from services.gateway.metrics.custom import CustomMetrics
from services.gateway.metrics.endpoint import MetricsOptions, build_metrics_app, resent_lines
from services.gateway.metrics.quantiles import parse_quantiles
from services.scheduler.cohosted import CoHosted
from shared import bus, discovery, subjects
from shared.dispatch import Dispatcher
from shared.logsettings import follow
from shared.messages import CacheEvent, StatisticsRequest
from shared.settings import GatewaySettings, cohosted_scheduler
from shared.tensors import TensorStore

log = logging.getLogger("shoal.gateway")


class _Server(uvicorn.Server):
    """Signals belong to the process (`shared.runtime`), not to each listener."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def metrics_options(settings: GatewaySettings) -> MetricsOptions:
    quantiles = parse_quantiles(settings.summary_quantiles)
    return MetricsOptions(
        settings.counter_latencies,
        settings.summary_latencies,
        settings.histogram_latencies,
        quantiles or MetricsOptions().quantiles,
        settings.allow_cpu_metrics,
        settings.allow_gpu_metrics,
    )


def tracer(settings: GatewaySettings) -> trace.Tracer:
    levels = tuple(level.strip().upper() for level in settings.trace_level.split(","))
    return trace.Tracer(
        trace.TraceSettings(
            levels, settings.trace_rate, settings.trace_count, settings.trace_log_frequency, settings.trace_file
        )
    )


def _openai_server(settings: GatewaySettings, core: InferenceCore) -> _Server:
    """The OpenAI-compatible API on its own port (docs/openai.md), over the same core."""
    from services.gateway.openai.app import build_openai_app

    return _Server(
        uvicorn.Config(
            build_openai_app(core, settings.http_max_input_size),
            host=settings.openai_address or settings.http_address,
            port=settings.openai_port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=settings.exit_timeout_s,  # type: ignore[arg-type]  # annotated int, any seconds work
        )
    )


async def run(settings: GatewaySettings, stop: asyncio.Event) -> None:
    options = metrics_options(settings)  # read before anything starts: what it logs comes first
    nc = await bus.connect(settings.nats_url, f"shoal-gateway-{settings.gateway_id}")
    await follow(nc, "gateway")
    store = TensorStore(nc, settings.gateway_id, settings.inline_max_bytes, settings.tensor_transport)
    await store.start()
    registry = ModelRegistry()
    await registry.start(nc)
    inbox = subjects.gateway_inbox(settings.gateway_id)
    scheduler = CoHosted(cohosted_scheduler(settings), nc, inbox) if settings.cohost_scheduler else None
    dispatcher = Dispatcher(
        nc, settings.gateway_id, store, scheduler, lambda model: bool(registry.ready_versions(model))
    )
    await dispatcher.start()
    if scheduler is not None:  # after the dispatcher: the batches it sends complete on the dispatcher's inbox
        await scheduler.start()
    shm = ShmRegistry(nc, store.host, settings.allow_client_shm)
    await shm.start()

    async def cache_event(event: CacheEvent) -> None:  # the scheduler counts hits and misses
        await nc.publish(subjects.SCHEDULER_CACHE, msgspec.msgpack.encode(event))

    requests_tracer = tracer(settings)
    core = InferenceCore(
        registry,
        dispatcher,
        store,
        settings.request_timeout_s,
        shm,
        ResponseCache(settings.cache_bytes) if settings.cache_bytes > 0 else None,
        requests_tracer,
        cache_event,
        DemandLoads(nc, registry, settings.request_timeout_s),
    )
    server = InferenceServer(
        nc,
        core,
        shm,
        requests_tracer,
        settings.id,
        settings.strict_readiness,
        settings.repository_timeout_s,
        settings.log_verbose,
    )

    def status() -> dict:
        return {
            "http": f"{settings.http_address}:{settings.http_port}",
            "grpc": f"{settings.grpc_address}:{settings.grpc_port}" if settings.allow_grpc else "off",
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
        grpc_port=str(settings.grpc_port) if settings.allow_grpc else "",
        metrics_port=str(settings.metrics_port),
    )

    async def metrics_stats(quantiles: list[float]) -> dict:
        return await scheduler_stats(nc, msgspec.json.encode(StatisticsRequest(quantiles)) if quantiles else b"")

    custom = CustomMetrics()
    await custom.start(nc)

    async def custom_metrics() -> list[str]:
        return model_metrics.render(await model_metrics.fetch(nc)) + custom.lines() + resent_lines(dispatcher.resent)

    servers = [
        _Server(
            uvicorn.Config(
                build_app(server, settings.http_max_input_size, settings.http_restricted_api),
                host=settings.http_address,
                port=settings.http_port,
                http=CorkedHttpToolsProtocol,
                proxy_headers=False,  # no X-Forwarded-* rewriting: it wrapped every request (~2% of the gateway)
                log_level="warning",
                access_log=False,
                timeout_graceful_shutdown=settings.exit_timeout_s,  # type: ignore[arg-type]  # annotated int, any seconds work
            )
        )
    ]
    if settings.allow_metrics:
        servers.append(
            _Server(
                uvicorn.Config(
                    build_metrics_app(metrics_stats, options, custom_metrics),
                    host=settings.metrics_address or settings.http_address,
                    port=settings.metrics_port,
                    log_level="warning",
                    access_log=False,
                )
            )
        )
    if settings.openai_port:
        servers.append(_openai_server(settings, core))
    metrics_address = settings.metrics_address or settings.http_address
    started = log.info if settings.log_started else log.debug  # under shoal serve, the supervisor says it
    grpc_listener = await grpc_server.start(settings, server) if settings.allow_grpc else None
    if grpc_listener is not None:
        started("Started GRPCInferenceService at %s:%d", settings.grpc_address, settings.grpc_port)
    started("Started HTTPService at %s:%d", settings.http_address, settings.http_port)
    if settings.allow_metrics:
        started("Started Metrics Service at %s:%d", metrics_address, settings.metrics_port)
    if settings.openai_port:
        started(
            "Started OpenAI-compatible API at %s:%d",
            settings.openai_address or settings.http_address,
            settings.openai_port,
        )

    async def stop_servers() -> None:
        await stop.wait()
        for listener in servers:
            listener.should_exit = True
        if grpc_listener is not None:
            await grpc_listener.stop(settings.exit_timeout_s)  # in-flight calls may finish

    stopper = asyncio.create_task(stop_servers())
    try:
        shared = http_sockets(settings.http_address, settings.http_port, settings.reuse_http_port)
        await asyncio.gather(*(server.serve(shared if i == 0 else None) for i, server in enumerate(servers)))
    finally:
        stopper.cancel()
        if grpc_listener is not None:
            await grpc_listener.stop(0)
        await micro.stop()
        if scheduler is not None:  # after the listeners: their in-flight requests were answered
            await scheduler.stop()
        await shm.stop()
        await registry.stop()
        await store.close()
        await nc.drain()

"""The gateway's process: its front ends (HTTP, gRPC, metrics, OpenAI) over one inference core,
its co-hosted scheduler replica, on one NATS connection; run by `shared.process.runtime` as every service."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec
import uvicorn
from nats.aio.client import Client as NATS
from nats.micro.service import Service as MicroService

from inference import trace
from inference.cache import Cache, ResponseCache
from inference.core import InferenceCore
from inference.models import ModelRegistry
from inference.on_demand import DemandLoads
from inference.replica_statistics import scheduler_stats
from inference.repository_startup import RepositoryStartup
from inference.server import InferenceServer
from inference.shm import ShmRegistry
from services.gateway.grpc import startup as grpc_startup
from services.gateway.http.app import build_app
from services.gateway.http.guard import GuardedHttpToolsProtocol, Limits, with_limits
from services.gateway.http.listener import http_sockets, supervisor_socket
from services.gateway.http.protocol import CorkedHttpToolsProtocol
from services.gateway.http.restricted import HttpApp
from services.gateway.http.sagemaker import SageMaker
from services.gateway.http.sagemaker_models import MultiModel
from services.gateway.http.vertex_ai import NoDefaultModel, VertexAi
from services.gateway.listeners import Listeners, raise_descriptor_limit
from services.gateway.metrics import model_management as model_metrics
from services.gateway.metrics.custom import CustomMetrics
from services.gateway.metrics.endpoint import MetricsOptions, build_metrics_app, resent_lines
from services.gateway.metrics.quantiles import parse_quantiles
from services.scheduler.batching.worker_channels import WorkerChannels
from services.scheduler.cohosted import CoHosted
from shared.bus import connection, discovery, eager
from shared.bus.dispatch import Dispatcher
from shared.bus.tensor_store import TensorStore
from shared.process.runtime import serve_until
from shared.process.settings import GatewaySettings, cohosted_scheduler
from shared.tracing import spans
from shared.tracing import trace_settings as tracing_settings
from shared.wire import subjects
from shared.wire.control import ModelFigures, StatisticsRequest
from shared.wire.messages import CacheEvent
from shared.wire.statistics import SchedulerStatistics
from shared.wire.status import GatewayStatus

log = logging.getLogger("shoal.gateway")


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
    """The trace extension's settings: the trace fields, then `--trace-config`'s global entries
    (`shoal gateway` takes them too); in opentelemetry mode spans go to this process's exporter."""
    fields = {"level": settings.trace_level, "rate": str(settings.trace_rate), "count": str(settings.trace_count)}
    for entry in settings.trace_config:
        section, key, value = tracing_settings.split(entry)
        if not section and key in fields:
            fields[key] = value
    levels = tuple(level.strip().upper() for level in fields["level"].split(","))
    mode = tracing_settings.mode(settings.trace_config)
    otel = tracing_settings.opentelemetry(settings.trace_config) if mode == "opentelemetry" else None
    return trace.Tracer(
        trace.TraceSettings(
            levels,
            int(fields["rate"]),
            int(fields["count"]),
            settings.trace_log_frequency,
            settings.trace_file,
            mode,
            otel.entries if otel is not None else (),
        ),
        spans.install(otel, "gateway", settings.gateway_id),
    )


class GatewayService:
    """The gateway's parts on one NATS connection. `start` starts them in the order they depend on
    each other, the front ends last; `stop` stops the front ends first, so that the requests in
    flight are answered while the rest still runs."""

    def __init__(self, settings: GatewaySettings, nc: NATS, options: MetricsOptions) -> None:
        self.settings = settings
        self.nc = nc
        self.options = options
        self.store = TensorStore(nc, settings.gateway_id, settings.inline_max_bytes, settings.tensor_transport)
        self.registry = ModelRegistry()
        self.scheduler = self._cohosted_scheduler()
        self.dispatcher = Dispatcher(
            nc, settings.gateway_id, self.store, self.scheduler, lambda model: bool(self.registry.ready_versions(model))
        )
        self.shm = ShmRegistry(nc, self.store.host, settings.allow_client_shm)
        self.tracer = tracer(settings)
        self.core = self._inference_core()
        self.startup = RepositoryStartup(nc, self.registry)
        self.server = InferenceServer(
            nc,
            self.core,
            self.shm,
            self.tracer,
            settings.id,
            settings.strict_readiness,
            settings.repository_timeout_s,
            settings.log_verbose,
            self.startup,
        )
        self.custom = CustomMetrics()
        self.listeners = Listeners(settings.exit_timeout_s)
        self._micro: MicroService | None = None
        # under shoal serve, the supervisor says what started
        self._started = log.info if settings.log_started else log.debug

    # -- collaborators ----------------------------------------------------------------------
    def _cohosted_scheduler(self) -> CoHosted | None:
        """The scheduler replica in this process (docs/design.md, "Co-hosting"), if asked for."""
        if not self.settings.cohost_scheduler:
            return None
        inbox = subjects.gateway_inbox(self.settings.gateway_id)
        return CoHosted(cohosted_scheduler(self.settings), self.nc, inbox, self._worker_channels())

    def _worker_channels(self) -> WorkerChannels | None:
        """The co-hosted scheduler's local channels to this host's workers (docs/design.md §9)."""
        if not self.settings.local_channel:
            return None
        return WorkerChannels(self.store.host, self._batch_done, self._worker_channel_closed)

    def _batch_done(self, data: bytes) -> None:
        eager.start(self.dispatcher.batch_done(data))  # as the inbox's callback runs it: no task unless it waits

    def _worker_channel_closed(self, worker: str) -> None:
        if self.scheduler is not None:
            self.scheduler.worker_suspect(worker)

    def _response_cache(self) -> Cache | None:
        """`--cache-config redis,...` (every gateway shares it), `local,size=N`, or none."""
        if self.settings.cache_redis:
            from inference.redis_cache import RedisCache, parse_options

            return RedisCache(parse_options(self.settings.cache_redis))
        return ResponseCache(self.settings.cache_bytes) if self.settings.cache_bytes > 0 else None

    def _inference_core(self) -> InferenceCore:
        settings = self.settings
        return InferenceCore(
            self.registry,
            self.dispatcher,
            self.store,
            settings.request_timeout_s,
            self.shm,
            self._response_cache(),
            self.tracer,
            self._cache_event,
            DemandLoads(self.nc, self.registry, settings.request_timeout_s),
        )

    async def _cache_event(self, event: CacheEvent) -> None:
        """The scheduler that owns the model counts the response cache's hits and misses."""
        await self.nc.publish(subjects.SCHEDULER_CACHE, msgspec.msgpack.encode(event))

    # -- start and stop -----------------------------------------------------------------------
    async def start(self) -> None:
        await self.store.start()
        await self.registry.start(self.nc)
        await self.startup.start()
        await self.dispatcher.start()
        if self.scheduler is not None:  # after the dispatcher: the batches it sends complete on the dispatcher's inbox
            await self.scheduler.start()
        await self.shm.start()
        self._micro = await self._register()
        await self.custom.start(self.nc)
        await self.server.hosted.start()
        await self._start_front_ends()

    async def stop(self) -> None:
        await self.listeners.stop()  # first: their requests in flight are answered
        if self._micro is not None:
            await self._micro.stop()
        if self.scheduler is not None:  # after the listeners: their in-flight requests were answered
            await self.scheduler.stop()
        await self.shm.stop()
        await self.startup.stop()
        await self.registry.stop()
        await self.server.hosted.stop()
        await self.store.close()

    async def _register(self) -> MicroService:
        """On NATS micro, for `shoal status` (shared/bus/discovery.py)."""
        settings = self.settings
        return await discovery.register(
            self.nc,
            "gateway",
            settings.gateway_id,
            self._status,
            http_port=str(settings.http_port) if settings.allow_http else "",
            grpc_port=str(settings.grpc_port) if settings.allow_grpc else "",
            metrics_port=str(settings.metrics_port),
        )

    def _status(self) -> GatewayStatus:
        settings = self.settings
        return GatewayStatus(
            http=f"{settings.http_address}:{settings.http_port}" if settings.allow_http else "off",
            grpc=f"{settings.grpc_address}:{settings.grpc_port}" if settings.allow_grpc else "off",
            models=len(self.registry.records),
            requests_in_flight=self.dispatcher.in_flight,
            shm_regions=len(self.shm.regions),
        )

    # -- front ends -----------------------------------------------------------------------------
    async def _start_front_ends(self) -> None:
        settings = self.settings
        if settings.allow_grpc:
            self.listeners.add_grpc(await grpc_startup.start(settings, self.server))
            self._started("Started GRPCInferenceService at %s:%d", settings.grpc_address, settings.grpc_port)
        if settings.allow_http:
            sockets = http_sockets(settings.http_address, settings.http_port, settings.reuse_http_port)
            await self.listeners.serve(self._http(), sockets)
            self._started("Started HTTPService at %s:%d", settings.http_address, settings.http_port)
        elif settings.runtime_dir:  # --allow-http=false: no port, only `shoal serve`'s way in (private dir)
            await self.listeners.serve(self._http(uds=supervisor_socket(settings.runtime_dir, settings.gateway_id)))
        if settings.allow_sagemaker:
            http = self._http_app()  # the same API, restrictions and header forwarding as the HTTP port
            sagemaker = SageMaker(
                http,
                settings.sagemaker_model,
                settings.sagemaker_inference_type,
                settings.sagemaker_ping_mode,
                MultiModel(http, settings.sagemaker_models_root, settings.http_max_input_size),
            )
            await self.listeners.serve(self._uvicorn(sagemaker, settings.http_address, settings.sagemaker_port))
            self._started("Started Sagemaker HTTPService at %s:%d", settings.http_address, settings.sagemaker_port)
        if settings.allow_vertex_ai:
            await self.listeners.serve(self._vertex_ai())
            self._started("Started Vertex AI HTTPService at %s:%d", settings.http_address, settings.vertex_ai_port)
        if settings.allow_metrics:
            await self.listeners.serve(self._metrics())
            address = settings.metrics_address or settings.http_address
            self._started("Started Metrics Service at %s:%d", address, settings.metrics_port)
        if settings.openai_port:
            await self.listeners.serve(self._openai())
            address = settings.openai_address or settings.http_address
            self._started("Started OpenAI-compatible API at %s:%d", address, settings.openai_port)

    def _http_app(self) -> HttpApp:
        """KServe v2 and Triton's extensions (services/gateway/http/)."""
        settings = self.settings
        return build_app(
            self.server,
            settings.http_max_input_size,
            settings.http_restricted_api,
            header_forward_pattern=settings.http_header_forward_pattern,
        )

    def _http(self, **options: Any) -> uvicorn.Config:
        settings = self.settings
        return self._uvicorn(
            self._http_app(),
            settings.http_address,
            settings.http_port,
            http=CorkedHttpToolsProtocol,
            proxy_headers=False,  # no X-Forwarded-* rewriting: it wrapped every request (~2% of the gateway)
            **options,
        )

    def _vertex_ai(self) -> uvicorn.Config:
        """Vertex AI's routes over the HTTP API, on a port of their own (services/gateway/http/vertex_ai.py)."""
        settings = self.settings
        http = self._http_app()  # the same API, restrictions and header forwarding as the HTTP port
        metrics = build_metrics_app(self._scheduler_stats, self.options, self._custom_metrics, self._model_figures)
        routes = settings.vertex_ai_predict_route, settings.vertex_ai_health_route
        app = VertexAi(http, metrics, *routes, self._vertex_ai_model)
        return self._uvicorn(app, settings.http_address, settings.vertex_ai_port)

    def _vertex_ai_model(self) -> str:
        """tritonserver's default model: the one named, else the one model the server has loaded."""
        if self.settings.vertex_ai_default_model:
            return self.settings.vertex_ai_default_model
        loaded = [name for name in self.registry.records if self.registry.ready_versions(name)]
        if len(loaded) != 1:
            raise NoDefaultModel(
                "Expect the model repository contains only a single model if default model is not specified"
            )
        return loaded[0]

    def _metrics(self) -> uvicorn.Config:
        """Prometheus' `/metrics`, from the schedulers' statistics and the workers' (gateway/metrics/)."""
        settings = self.settings
        app = build_metrics_app(self._scheduler_stats, self.options, self._custom_metrics, self._model_figures)
        return self._uvicorn(app, settings.metrics_address or settings.http_address, settings.metrics_port)

    def _openai(self) -> uvicorn.Config:
        """The OpenAI-compatible API on its own port (docs/openai.md), over the same core."""
        from services.gateway.openai.api_keys import ApiKeys
        from services.gateway.openai.openai_app import build_openai_app

        settings = self.settings
        keys = ApiKeys.load(settings.openai_api_key.get_secret_value(), settings.openai_api_key_file)
        app = build_openai_app(self.core, settings.http_max_input_size, keys, settings.tool_call_parser)
        return self._uvicorn(app, settings.openai_address or settings.http_address, settings.openai_port)

    def _uvicorn(
        self,
        app: Any,
        host: str,
        port: int,
        http: type[GuardedHttpToolsProtocol] = GuardedHttpToolsProtocol,
        **options: Any,
    ) -> uvicorn.Config:
        settings = self.settings
        limits = Limits(settings.http_max_header_size, settings.http_header_timeout_s, settings.http_max_input_size)
        return uvicorn.Config(
            app,
            host=host,
            port=port,
            http=with_limits(http, limits),  # every listener bounds what a client may hold (docs/security.md)
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=settings.exit_timeout_s,  # type: ignore[arg-type]  # annotated int, any seconds work
            # uvicorn's 5 s raced clients that pool connections: one that sent just as the idle
            # connection closed got a reset (tritonclient does not resend a POST; seen in the soak)
            timeout_keep_alive=settings.http_keepalive_timeout_s,  # type: ignore[arg-type]  # as above
            **options,
        )

    async def _scheduler_stats(self, quantiles: list[float]) -> SchedulerStatistics:
        request = msgspec.json.encode(StatisticsRequest(quantiles)) if quantiles else b""
        return await scheduler_stats(self.nc, request)

    async def _model_figures(self) -> ModelFigures | None:
        return await model_metrics.fetch(self.nc)

    async def _custom_metrics(self) -> list[str]:
        return self.custom.lines() + resent_lines(self.dispatcher.resent)


async def run(settings: GatewaySettings, stop: asyncio.Event) -> None:
    options = metrics_options(settings)  # read before anything starts: what it logs comes first
    raise_descriptor_limit()
    nc = await connection.connect(settings.nats_url, f"shoal-gateway-{settings.gateway_id}", settings.nats_credentials)
    try:
        await serve_until(stop, nc, GatewayService(settings, nc, options), "gateway")
    finally:
        spans.uninstall()

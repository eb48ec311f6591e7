"""One typed settings model per service; flags, env vars (SHOAL_<SERVICE>_*) and defaults.

The flags themselves (`add_arguments`, `to_argv`, `--help`'s lines) are `settings_flags.py`'s,
re-exported here for the callers that read settings and flags together.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator

from shared.config.backend_config import DEFAULT_DIRECTORY
from shared.memory.footprint import parse_budget
from shared.process.settings_env import BaseSettings, NoDecode, SettingsConfigDict
from shared.process.settings_flags import (
    add_arguments,
    add_setting,
    from_namespace,
    help_text,
    parse_bool,
    to_argv,
)

# the flags' helpers, re-exported: callers read settings and their flags from one module
__all__ = [
    "add_arguments",
    "add_setting",
    "from_namespace",
    "help_text",
    "parse_bool",
    "to_argv",
]


class BusSettings(BaseSettings):
    nats_url: str = Field("nats://127.0.0.1:4222", description="NATS server URL(s), comma separated")
    nats_credentials: str = Field(
        "", description="this service's NATS identity: an nkey seed file or a .creds file (docs/security.md)"
    )
    runtime_dir: str = Field(
        "", description="a private directory (0700) of this user for local sockets (docs/design.md §9)"
    )
    log_verbose: int = Field(0, description="verbose logging level (as tritonserver)")
    trace_config: list[str] = Field(
        default_factory=list,
        description="tritonserver's --trace-config entries; with mode=opentelemetry this service exports "
        "its spans over OTLP/HTTP (opentelemetry,url=...; docs/serving.md, 'Tracing')",
    )


def _random_id() -> str:
    return uuid.uuid4().hex[:12]


def _health_port() -> Any:
    return Field(
        0,
        description="serve Triton's /v2/health/live and /v2/health/ready on this port, for an orchestrator's "
        "probes (docs/kubernetes.md); 0: none",
    )


class GatewaySettings(BusSettings):
    model_config = SettingsConfigDict(env_prefix="SHOAL_GATEWAY_")
    gateway_id: str = Field(
        default_factory=_random_id, description="this gateway's id on the bus", json_schema_extra={"shown": "random"}
    )
    id: str = Field("triton", description="server name in GET /v2")
    http_address: str = Field("0.0.0.0", description="address the HTTP endpoint listens on")
    http_port: int = Field(8000, description="HTTP port (KServe v2 and Triton's extensions)")
    reuse_http_port: bool = Field(False, description="let other servers listen on the same HTTP port (SO_REUSEPORT)")
    metrics_address: str = Field(
        "", description="address the metrics endpoint listens on", json_schema_extra={"shown": "--http-address"}
    )
    metrics_port: int = Field(8002, description="Prometheus metrics port (/metrics)")
    openai_address: str = Field(
        "",
        description="address the OpenAI-compatible endpoint listens on",
        json_schema_extra={"shown": "--http-address"},
    )
    openai_port: int = Field(0, description="OpenAI-compatible API port (/v1/...; docs/openai.md); 0: off")
    # never on a command line (`to_argv` leaves it out: `ps` shows argv to every user): from the
    # environment (SHOAL_GATEWAY_OPENAI_API_KEY, readable by this user only) or --openai-api-key-file
    openai_api_key: SecretStr = Field(
        SecretStr(""),
        exclude=True,
        description="the key an OpenAI client must send (Authorization: Bearer <key>); 401 without it",
        json_schema_extra={"shown": "none: open"},
    )
    openai_api_key_file: str = Field(
        "", description="a file of OpenAI API keys, one per line: any of them is accepted (docs/openai.md)"
    )
    tool_call_parser: Literal["hermes", "llama3", "mistral"] = Field(
        "hermes",
        description="how the OpenAI API reads tool calls from a model's text: hermes (<tool_call> blocks), "
        "llama3, mistral; a model's tool_call_parser parameter wins (docs/openai.md)",
    )
    allow_metrics: bool = Field(True, description="serve the metrics endpoint")
    allow_cpu_metrics: bool = Field(True, description="CPU utilization and memory gauges")
    allow_gpu_metrics: bool = Field(True, description="GPU gauges through NVML, when a GPU exists")
    counter_latencies: bool = Field(True, description="per-model latency counters (nv_inference_*_duration_us)")
    summary_latencies: bool = Field(False, description="per-model latency summaries (quantiles)")
    histogram_latencies: bool = Field(False, description="per-model latency histograms")
    summary_quantiles: str = Field(
        "",
        description="q:error,... for the latency summaries",
        json_schema_extra={"shown": "Triton's 0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001"},
    )
    allow_http: bool = Field(
        True,
        description="serve the HTTP endpoint (KServe v2 HTTP and Triton's extensions); false: no HTTP port "
        "(with a runtime directory, a Unix socket there for `shoal serve`'s own readiness checks)",
    )
    allow_sagemaker: bool = Field(False, description="serve the SageMaker endpoint (/ping, /invocations; one model)")
    sagemaker_port: int = Field(8080, description="SageMaker endpoint port")
    sagemaker_model: str = Field("", description="the model /invocations goes to (SAGEMAKER_TRITON_DEFAULT_MODEL_NAME)")
    sagemaker_inference_type: str = Field(
        "infer", description="the route /invocations answers as: infer, generate or generate_stream"
    )
    sagemaker_ping_mode: str = Field("ready", description="the health /ping answers as: ready or live")
    sagemaker_models_root: str = Field(
        "/opt/ml/models",
        description="SageMaker's multi-model loads read only <root>/<hash>/model[/<subdir>] (tritonserver's "
        "fixed /opt/ml/models: docs/security.md)",
    )
    allow_vertex_ai: bool = Field(False, description="serve the Vertex AI endpoint (its routes: AIP_* settings)")
    vertex_ai_port: int = Field(8080, description="Vertex AI endpoint port (tritonserver: AIP_HTTP_PORT, else 8080)")
    vertex_ai_default_model: str = Field(
        "", description="the model Vertex AI predictions go to (default: the one loaded)"
    )
    vertex_ai_predict_route: str = Field("", description="Vertex AI's prediction route, a regex (AIP_PREDICT_ROUTE)")
    vertex_ai_health_route: str = Field("", description="Vertex AI's health route, a regex (AIP_HEALTH_ROUTE)")
    http_max_input_size: int = Field(64 * 1024 * 1024, description="largest request body in bytes")
    http_max_header_size: int = Field(
        64 * 1024, description="largest request line and headers in bytes (431 beyond; docs/security.md)"
    )
    http_header_timeout_s: float = Field(
        10.0, description="seconds a client has to send a request's headers (408 beyond; docs/security.md)"
    )
    http_keepalive_timeout_s: float = Field(
        75.0,
        description="seconds a keep-alive connection may wait idle for its next request before it is closed "
        "(docs/security.md): long enough for a pooled client's pauses, unlike uvicorn's 5 s",
    )
    grpc_stream_unread_bytes: int = Field(
        64 * 1024 * 1024,
        description="a gRPC stream's responses held for a client that does not read them, in bytes: "
        "past this its request is cancelled (docs/reliability.md, Overload)",
    )
    http_restricted_api: list[str] = Field(
        default_factory=list, description="<api>[,<api>...]:<header>=<value>: those APIs need that header (403)"
    )
    http_header_forward_pattern: str = Field(
        "", description="HTTP headers whose name matches this regex become request parameters (case-insensitive)"
    )
    grpc_header_forward_pattern: str = Field(
        "", description="gRPC metadata whose key matches this regex becomes request parameters (case-insensitive)"
    )
    request_timeout_s: float = Field(60.0, description="deadline of a request with no timeout of its own")
    inline_max_bytes: int = Field(65536, description="tensors up to this size travel inside the bus message")
    tensor_transport: Literal["auto", "shm", "bus"] = Field(
        "auto", description="how larger tensors travel: shared memory on one host, the bus, or auto-detect"
    )
    strict_readiness: bool = Field(True, description="ready only while every model is ready (as tritonserver)")
    local_channel: bool = Field(
        True,
        description="batches of the co-hosted scheduler reach the workers of this host, and their answers come "
        "back, over a Unix socket instead of nats-server (docs/design.md §9); false: always over NATS",
    )
    allow_client_shm: bool = Field(
        False, description="client shared memory (system and CUDA), off unless asked as in Triton"
    )
    cache_bytes: int = Field(0, description="response cache size in bytes (0 = no cache)")
    cache_redis: list[str] = Field(
        default_factory=list, description="key=value settings of a Redis response cache (host and port at least)"
    )
    trace_file: str = Field("", description="file the traces are written to (JSON)")
    trace_level: str = Field("OFF", description="comma separated: OFF, TIMESTAMPS, TENSORS")
    trace_rate: int = Field(1000, description="trace one request in this many")
    trace_count: int = Field(-1, description="stop tracing after this many traces (-1 = never)")
    trace_log_frequency: int = Field(0, description="start a new trace file every this many traces (0 = one file)")
    exit_timeout_s: float = Field(30.0, description="on shutdown, how long in-flight requests may finish")
    repository_timeout_s: float = Field(330.0, description="how long a load/unload request waits for the repository")
    log_started: bool = Field(
        True,
        description="log tritonserver's 'Started HTTPService at ...' lines once listening "
        "(shoal serve logs them itself, after the models are loaded, as tritonserver)",
    )
    # gRPC, with tritonserver's names and defaults (docs/grpc.md)
    allow_grpc: bool = Field(True, description="serve the gRPC endpoint (KServe v2 gRPC and Triton's extensions)")
    grpc_address: str = Field("0.0.0.0", description="address the gRPC endpoint listens on")
    grpc_port: int = Field(8001, description="gRPC port")
    grpc_keepalive_time: int = Field(7_200_000, description="ms between keepalive pings")
    grpc_keepalive_timeout: int = Field(20_000, description="ms to wait for a keepalive ack")
    grpc_keepalive_permit_without_calls: bool = Field(False, description="keepalive pings even with no call open")
    grpc_http2_max_pings_without_data: int = Field(2, description="pings sent without data before a data frame")
    grpc_http2_min_recv_ping_interval_without_data: int = Field(
        300_000, description="ms between pings without data a client may send"
    )
    grpc_http2_max_ping_strikes: int = Field(2, description="bad pings before the connection is closed")
    grpc_use_ssl: bool = Field(False, description="TLS on the gRPC endpoint")
    grpc_use_ssl_mutual: bool = Field(False, description="mutual TLS (clients present a certificate)")
    grpc_server_cert: str = Field("", description="the server's certificate file (PEM)")
    grpc_server_key: str = Field("", description="the server's key file (PEM)")
    grpc_root_cert: str = Field("", description="root certificate file to verify clients (PEM)")
    grpc_infer_response_compression_level: Literal["none", "low", "medium", "high"] = Field(
        "none", description="compression of inference responses"
    )
    grpc_restricted_protocol: list[str] = Field(
        default_factory=list, description="<protocol>[,<protocol>...]:<key>=<value>: those need that header"
    )
    reuse_grpc_port: bool = Field(False, description="let several servers listen on the gRPC port (SO_REUSEPORT)")
    grpc_server: Literal["shoal", "grpcio"] = Field(
        "shoal", description="gRPC server: Shoal's HTTP/2 on the event loop, or grpcio's asyncio server (docs/grpc.md)"
    )
    # the scheduler replica in this process (docs/design.md, "Co-hosting"); the same settings as `shoal scheduler`
    cohost_scheduler: bool = Field(
        True, description="run a scheduler replica in this process (false: only standalone schedulers schedule)"
    )
    worker_timeout_s: float = Field(5.0, description="co-hosted scheduler: a worker silent this long is dropped")
    rate_limit: Literal["off", "execution_count"] = Field(
        "off", description="co-hosted scheduler: rate limiter, off or execution_count (as tritonserver)"
    )
    rate_limit_resource: list[str] = Field(
        default_factory=list, description="co-hosted scheduler: <name>:<count>[:<device>], a resource it shares out"
    )
    prefix_routing: bool = Field(
        True, description="co-hosted scheduler: a prompt goes to the instance that served its start (docs/openai.md)"
    )


def cohosted_scheduler(gateway: GatewaySettings) -> SchedulerSettings:
    """The settings of the scheduler replica a gateway co-hosts: the gateway's id and bus."""
    return SchedulerSettings(
        nats_url=gateway.nats_url,
        nats_credentials=gateway.nats_credentials,
        runtime_dir=gateway.runtime_dir,
        log_verbose=gateway.log_verbose,
        scheduler_id=gateway.gateway_id,
        worker_timeout_s=gateway.worker_timeout_s,
        rate_limit=gateway.rate_limit,
        rate_limit_resource=gateway.rate_limit_resource,
        prefix_routing=gateway.prefix_routing,
    )


class SchedulerSettings(BusSettings):
    model_config = SettingsConfigDict(env_prefix="SHOAL_SCHEDULER_")
    scheduler_id: str = Field(
        default_factory=_random_id, description="this scheduler's id on the bus", json_schema_extra={"shown": "random"}
    )
    worker_timeout_s: float = Field(5.0, description="a worker silent this long is dropped")
    rate_limit: Literal["off", "execution_count"] = Field(
        "off", description="rate limiter: off, or execution_count (as tritonserver)"
    )
    rate_limit_resource: list[str] = Field(
        default_factory=list, description="<name>:<count>[:<device>]: a resource the rate limiter shares out"
    )
    prefix_routing: bool = Field(
        True, description="a prompt goes to the instance that served its start, load permitting (docs/openai.md)"
    )
    health_port: int = _health_port()


def _worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class WorkerSettings(BusSettings):
    model_config = SettingsConfigDict(env_prefix="SHOAL_WORKER_")
    worker_id: str = Field(
        default_factory=_worker_id,
        description="this worker's id on the bus",
        json_schema_extra={"shown": "<host>-<pid>-<random>"},
    )
    inline_max_bytes: int = Field(65536, description="tensors up to this size travel inside the bus message")
    tensor_transport: Literal["auto", "shm", "bus"] = Field(
        "auto", description="how larger tensors travel: shared memory on one host, the bus, or auto-detect"
    )
    intra_op_threads: int = Field(
        0,
        description="intra-op threads per instance when the model config sets none "
        "(0 = the backend's default: 1 per onnxruntime instance, cores / instances for PyTorch)",
    )
    model_load_thread_count: int = Field(4, ge=1, description="models loaded at once (tritonserver's flag)")
    model_load_retry_count: int = Field(
        0, ge=0, description="times a model whose load failed is loaded again before it is UNAVAILABLE"
    )
    model_cache_dir: str = Field(
        "",
        description="where model files fetched from NATS are kept, shared by the workers of one host",
        json_schema_extra={"shown": "~/.cache/shoal/model-files"},
    )
    heartbeat_s: float = Field(1.0, description="seconds between the worker's heartbeats to the schedulers")
    drain_timeout_s: float = Field(
        30.0,
        description="on SIGTERM, the worker stops taking batches and finishes those it holds for up to this "
        "many seconds before it stops (docs/scaling.md); 0: stop at once",
    )
    local_channel: bool = Field(
        True,
        description="take batches from gateways on this host over a Unix socket as well as over NATS "
        "(docs/design.md §9); false: NATS only",
    )
    models: list[str] = Field(
        default_factory=list, description="host only models matching these globs (none = every model)"
    )
    python_isolation: Literal["instance", "model", "none", "process"] = Field(
        "instance",
        description="python-backend models: 'instance': each instance in a worker process of its own, as "
        "Triton's stubs (count: N runs N executes at once; a crash takes down only that instance, which is "
        "restarted); 'model': one process per model, its instances as threads of it ('process' is an older "
        "name of it); 'none': in this worker's process",
    )
    parent_pid: int = Field(
        0,
        description="set for the worker process of one python model or instance: the worker that "
        "started it (it dies with that worker)",
    )
    instance_credentials: str = Field(
        "",
        description="the NATS identity of this worker's python model processes (docs/security.md)",
        json_schema_extra={"shown": "--nats-credentials"},
    )
    python_fork: bool = Field(
        True,
        description="python model processes fork from one process that imported Shoal once (they "
        "share its memory and start at once); false: each starts its own interpreter",
    )
    instance_index: int = Field(
        -1,
        description="set for the worker process of one instance (--python-isolation instance): which "
        "instance of its model it hosts, in instance_group order (-1: all of them)",
    )
    instance_group: str = Field(
        "",
        description="set for the worker process of one instance: the id its model's instance processes "
        "report under together (the repository counts the model loaded once all have loaded)",
    )
    model_memory_budget: str = Field(
        "",
        description="on-demand mode: memory this worker's loaded models may take, in bytes (2G, 512M) or a "
        "percentage of RAM (40%%); the least recently used idle models are evicted to stay under it",
        json_schema_extra={"shown": "none"},
    )
    max_loaded_models: int = Field(0, ge=0, description="on-demand mode: models this worker may hold (0 = no limit)")
    backend_directory: str = Field(
        DEFAULT_DIRECTORY,
        description="where backends Shoal does not have built in are looked for: <dir>/<name>/model.py "
        "(a python-based backend)",
    )
    backend_config: list[str] = Field(
        default_factory=list, description="<backend>,<setting>=<value> or <setting>=<value>, as tritonserver"
    )
    credits_per_instance: int = Field(
        2,
        description="batches the scheduler may send an instance ahead: the next one waits at the worker "
        "instead of a bus round trip after each batch",
    )
    health_port: int = _health_port()

    @field_validator("python_isolation")
    @classmethod
    def _isolation(cls, value: str) -> str:
        return "model" if value == "process" else value  # the older name of one process per model

    @field_validator("model_memory_budget")
    @classmethod
    def _budget(cls, value: str) -> str:
        parse_budget(value, ram=0)  # a bad budget stops the worker at once, saying what is expected
        return value


class RepositorySettings(BusSettings):
    model_config = SettingsConfigDict(env_prefix="SHOAL_REPOSITORY_")
    # several, as tritonserver: each folder or bucket is scanned (services/repository/repositories.py);
    # a plain string is one (the environment's SHOAL_REPOSITORY_MODEL_REPOSITORY, older callers)
    model_repository: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="model repository path or bucket, repeatable"
    )
    model_namespacing: bool = Field(
        False, description="models of the same name in different repositories coexist (as tritonserver)"
    )
    model_control_mode: Literal["none", "poll", "explicit", "on-demand"] = Field(
        "none",
        description="none: load everything at start; poll: follow the repository; explicit: load API; "
        "on-demand: a request loads its model, idle ones are evicted under the workers' budgets",
    )
    load_model: list[str] = Field(
        default_factory=list, description="explicit and on-demand modes: models to load at start (* = all)"
    )
    pin_model: list[str] = Field(
        default_factory=list, description="on-demand mode: models (globs) never evicted once loaded"
    )
    thrash_window_s: float = Field(
        60.0, description="on-demand mode: a model requested again this soon after its eviction counts as thrash"
    )
    disable_auto_complete_config: bool = Field(False, description="never complete configs from the model files")
    model_config_name: str = Field(
        "", description="read <model>/configs/<name>.pbtxt where it exists instead of config.pbtxt (as tritonserver)"
    )
    backend_directory: str = Field(
        DEFAULT_DIRECTORY, description="python-based backends: <dir>/<name>/model.py completes their configs"
    )
    backend_config: list[str] = Field(
        default_factory=list, description="<backend>,<setting>=<value>: default-max-batch-size for auto-complete"
    )
    strict_model_config: bool = Field(False, description="older name of --disable-auto-complete-config")
    repository_poll_secs: int = Field(15, description="poll mode: rescan interval (file events act sooner)")
    load_timeout_s: float = Field(300.0, description="how long a load request waits for the workers")
    unload_timeout_s: float = Field(30.0, description="how long an unload waits for queued requests to drain")
    worker_timeout_s: float = Field(5.0, description="a worker silent this long no longer counts")
    model_files: Literal["store", "path"] = Field(
        "store",
        description="store: each loaded model version's files are published into NATS (JetStream object "
        "store) and every worker fetches what it loads, on any host; path: workers read them where the "
        "repository is (one host, or a disk every host mounts at the same path)",
    )
    health_port: int = _health_port()

    @field_validator("model_repository", mode="before")
    @classmethod
    def _one_or_several(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

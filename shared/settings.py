"""One typed settings model per service; flags, env vars (SHOAL_<SERVICE>_*) and defaults.

`add_arguments` builds argparse options from a model's fields and `to_argv` turns a
settings object back into flags, so `shoal serve` starts each child service with
exactly the settings it resolved.
"""

from __future__ import annotations

import argparse
import os
import socket
import uuid
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

TRUE = {"true", "on", "1", "yes"}
FALSE = {"false", "off", "0", "no"}


def parse_bool(value: str) -> bool:
    """tritonserver's boolean flag values: true/false/on/off/1/0, any case."""
    lowered = value.strip().lower()
    if lowered in TRUE:
        return True
    if lowered in FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean value '{value}' (use true/false/on/off/1/0)")


class BusSettings(BaseSettings):
    nats_url: str = Field("nats://127.0.0.1:4222", description="NATS server URL(s), comma separated")
    log_verbose: int = Field(0, description="verbose logging level (as tritonserver)")


class GatewaySettings(BusSettings):
    model_config = SettingsConfigDict(env_prefix="SHOAL_GATEWAY_")
    gateway_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    id: str = Field("triton", description="server name in GET /v2")
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    metrics_port: int = 8002
    allow_metrics: bool = True
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True
    counter_latencies: bool = True
    summary_latencies: bool = False
    histogram_latencies: bool = False
    summary_quantiles: str = Field("", description="q:error,... (default Triton's 0.5:0.05,0.9:0.01,...)")
    http_max_input_size: int = Field(64 * 1024 * 1024, description="largest request body in bytes")
    http_restricted_api: list[str] = Field(
        default_factory=list, description="<api>[,<api>...]:<header>=<value>: those APIs need that header (403)"
    )
    request_timeout_s: float = Field(60.0, description="deadline of a request with no timeout of its own")
    inline_max_bytes: int = 65536
    tensor_transport: Literal["auto", "shm", "bus"] = "auto"
    strict_readiness: bool = True
    allow_client_shm: bool = Field(False, description="client shared memory (off by default, as in Triton)")
    cache_bytes: int = Field(0, description="response cache size in bytes (0 = no cache)")
    trace_file: str = ""
    trace_level: str = Field("OFF", description="comma separated: OFF, TIMESTAMPS, TENSORS")
    trace_rate: int = 1000
    trace_count: int = -1
    trace_log_frequency: int = 0
    exit_timeout_s: float = Field(30.0, description="on shutdown, how long in-flight requests may finish")
    repository_timeout_s: float = Field(330.0, description="how long a load/unload request waits for the repository")


class SchedulerSettings(BusSettings):
    model_config = SettingsConfigDict(env_prefix="SHOAL_SCHEDULER_")
    scheduler_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    worker_timeout_s: float = Field(5.0, description="a worker silent this long is dropped")
    rate_limit: Literal["off", "execution_count"] = "off"
    rate_limit_resource: list[str] = Field(default_factory=list, description="<name>:<count>[:<device>]")


class WorkerSettings(BusSettings):
    model_config = SettingsConfigDict(env_prefix="SHOAL_WORKER_")
    worker_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    inline_max_bytes: int = 65536
    tensor_transport: Literal["auto", "shm", "bus"] = "auto"
    intra_op_threads: int = Field(
        0, description="onnxruntime/torch intra-op threads per instance (0 = cores / instances)"
    )
    heartbeat_s: float = 1.0
    models: list[str] = Field(
        default_factory=list, description="host only models matching these globs (default: every model)"
    )
    python_isolation: Literal["process", "none"] = Field(
        "process",
        description="python-backend models: each in a worker process of its own (a crash takes "
        "down only that model, which is restarted), or 'none': in this worker's process",
    )
    parent_pid: int = Field(
        0,
        description="set for the worker process of one python model: the worker that "
        "started it (it dies with that worker)",
    )
    credits_per_instance: int = Field(
        2,
        description="batches the scheduler may send an instance ahead: the next one waits at the worker "
        "instead of a bus round trip after each batch",
    )


class RepositorySettings(BusSettings):
    model_config = SettingsConfigDict(env_prefix="SHOAL_REPOSITORY_")
    model_repository: str = Field("", description="model repository path")
    model_control_mode: Literal["none", "poll", "explicit"] = "none"
    load_model: list[str] = Field(default_factory=list)
    disable_auto_complete_config: bool = False
    strict_model_config: bool = False
    repository_poll_secs: int = Field(15, description="poll mode: rescan interval (file events act sooner)")
    load_timeout_s: float = Field(300.0, description="how long a load request waits for the workers")
    unload_timeout_s: float = Field(30.0, description="how long an unload waits for queued requests to drain")
    worker_timeout_s: float = Field(5.0, description="a worker silent this long no longer counts")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, model: type[BaseSettings]) -> None:
    """One `--kebab-case` option per field; unset options fall back to env and defaults."""
    for name, info in model.model_fields.items():
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": info.description}
        annotation = info.annotation
        if annotation is bool:
            kwargs["type"] = parse_bool
            kwargs["metavar"] = "BOOL"
        elif annotation in (int, float):
            kwargs["type"] = annotation
        elif getattr(annotation, "__origin__", None) is list:
            kwargs["action"] = "append"
        parser.add_argument(_flag(name), **kwargs)


def from_namespace(model: type[BaseSettings], namespace: argparse.Namespace) -> Any:
    given = {k: v for k, v in vars(namespace).items() if k in model.model_fields}
    return model(**given)


def to_argv(settings: BaseSettings) -> list[str]:
    argv: list[str] = []
    for name, value in settings.model_dump().items():
        if isinstance(value, list):
            for item in value:
                argv += [_flag(name), str(item)]
        elif isinstance(value, bool):
            argv += [_flag(name), "true" if value else "false"]
        else:
            argv += [_flag(name), str(value)]
    return argv

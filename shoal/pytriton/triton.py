"""`Triton` and `TritonConfig`: PyTriton's server object, serving bound functions on Shoal.

    with Triton() as triton:
        triton.bind(model_name="Linear", infer_func=infer_fn, inputs=[...], outputs=[...])
        triton.serve()

`Triton()` starts the embedded cluster (as `shoal serve`); `TritonConfig(nats_url=...)` joins
a running one instead (its repository must be in explicit model-control mode, as the
embedded one is), so every copy of a script adds a worker for its models. In both cases this
process is a worker for the models it bound; `stop()` (also on Ctrl-C in `serve()`, on leaving
the `with` block and at exit) withdraws them: the last process serving a model unloads it.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from shoal.pytriton.binding import Binding
from shoal.pytriton.decorators import TritonContext
from shoal.pytriton.embedded import EmbeddedCluster
from shoal.pytriton.exceptions import PyTritonValidationError
from shoal.pytriton.model_config.model_config import ModelConfig
from shoal.pytriton.model_config.tensor import Tensor
from shoal.pytriton.worker import InProcessWorker

log = logging.getLogger("shoal.pytriton")

MONITORING_PERIOD_S = 10.0
ENV_PREFIX = "PYTRITON_TRITON_CONFIG_"


@dataclasses.dataclass(kw_only=True)
class TritonConfig:
    """PyTriton's server settings (tritonserver's flags; unset means the server's default) plus
    Shoal's `nats_url`. A field Shoal does not support is refused when the server starts."""

    model_repository: str | None = None
    id: str | None = None
    log_verbose: int | None = None
    log_file: str | None = None
    exit_timeout_secs: int | None = None
    exit_on_error: bool | None = None
    strict_readiness: bool | None = None
    allow_http: bool | None = None
    http_address: str | None = None
    http_port: int | None = None
    http_header_forward_pattern: str | None = None
    http_thread_count: int | None = None
    allow_grpc: bool | None = None
    grpc_address: str | None = None
    grpc_port: int | None = None
    allow_metrics: bool | None = None
    allow_gpu_metrics: bool | None = None
    allow_cpu_metrics: bool | None = None
    metrics_interval_ms: int | None = None
    metrics_port: int | None = None
    metrics_address: str | None = None
    metrics_config: list[str] | None = None
    trace_config: list[str] | None = None
    cache_config: list[str] | None = None
    cache_directory: str | None = None
    nats_url: str | None = None  # Shoal: join the cluster on this NATS instead of starting one
    nats_credentials: str | None = None  # Shoal: with nats_url, a worker's identity file (docs/security.md)

    def __post_init__(self) -> None:
        if self.allow_http not in (True, None) and self.allow_grpc not in (True, None):
            raise PyTritonValidationError("The `http` or `grpc` endpoint has to be allowed.")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> TritonConfig:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name in set(config) - set(fields):
            log.warning("Ignoring %s=%s as could not find matching config field.", name, config[name])
        return cls(**{name: _cast(fields[name].type, value) for name, value in config.items() if name in fields})

    @classmethod
    def from_env(cls) -> TritonConfig:
        """From `PYTRITON_TRITON_CONFIG_<FIELD>` environment variables, as PyTriton."""
        return cls.from_dict(
            {k[len(ENV_PREFIX) :].lower(): v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
        )


def _cast(annotation: Any, value: Any) -> Any:
    text = str(annotation)
    if not isinstance(value, str):
        return value
    if text.startswith("bool"):
        return value.strip().lower() in ("1", "true", "on", "yes")
    if text.startswith("int"):
        return int(value)
    if text.startswith("list"):
        return [value]
    return value


def _merged(config: TritonConfig | None) -> TritonConfig:
    """Explicit settings over environment variables over defaults (PyTriton's precedence)."""
    merged = {k: v for k, v in TritonConfig.from_env().to_dict().items() if v is not None}
    merged.update({k: v for k, v in (config.to_dict() if config else {}).items() if v is not None})
    return TritonConfig(**merged)


class Triton:
    def __init__(self, *, config: TritonConfig | None = None, workspace: Any = None) -> None:
        self._config = _merged(config)
        self._triton_context = TritonContext()
        self._bindings: list[Binding] = []
        self._cluster: EmbeddedCluster | None = None
        self._worker: InProcessWorker | None = None
        self._cv = threading.Condition()
        self._connected = False
        self._stopped = True
        self._stop_requested = False
        atexit.register(self.stop)

    # -- PyTriton's API -----------------------------------------------------------------
    def bind(
        self,
        model_name: str,
        infer_func: Callable | Sequence[Callable],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        model_version: int = 1,
        config: ModelConfig | None = None,
        strict: bool = False,
    ) -> None:
        """Bind a function (or one per instance) to a model; served at once if the server runs."""
        _validate_model_name(model_name)
        binding = Binding(
            model_name,
            model_version,
            infer_func,
            inputs,
            outputs,
            config or ModelConfig(),
            self._triton_context,
            strict,
            self._on_unrecoverable,
        )
        with self._cv:
            self._bindings.append(binding)
            connected = self._connected
        if connected:
            self._serve_binding(binding)

    def __enter__(self) -> Triton:
        self.run()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop()

    def run(self) -> None:
        """Start (or join) the cluster and serve the bound models; returns at once."""
        self._run_server()
        self.connect()

    def connect(self) -> None:
        with self._cv:
            if self._connected:
                return
            self._connected = True
            bindings = list(self._bindings)
        for binding in bindings:
            self._serve_binding(binding)

    def serve(self, monitoring_period_s: float = MONITORING_PERIOD_S) -> None:
        """Run, then block until `stop()` (another thread, an unrecoverable error), Ctrl-C or SIGTERM."""
        self.run()
        with _stop_signals(self._request_stop):
            with self._cv:
                try:
                    while self.is_alive() and not self._stop_requested:
                        self._cv.wait(timeout=monitoring_period_s)
                except KeyboardInterrupt:
                    log.info("SIGINT received, exiting.")
        self.stop()

    def _request_stop(self, *_: Any) -> None:
        # a signal handler: only wake serve(), which stops outside the handler
        self._stop_requested = True
        threading.Thread(target=self._notify, daemon=True).start()

    def _notify(self) -> None:
        with self._cv:
            self._cv.notify_all()

    @property
    def nats_url(self) -> str | None:
        """The NATS of the cluster this process serves on (Shoal's): other copies join with it."""
        return self._worker.settings.nats_url if self._worker is not None else self._config.nats_url

    @property
    def nats_credentials(self) -> str | None:
        """The worker identity other copies join with (`TritonConfig.nats_credentials`; docs/security.md)."""
        if self._worker is not None:
            return self._worker.settings.nats_credentials or None
        return self._config.nats_credentials

    def is_alive(self) -> bool:
        return not self._stopped and self._worker is not None and self._worker.alive

    def is_connected(self) -> bool:
        with self._cv:
            return self._connected

    def stop(self) -> bool:
        """Withdraw this process's models (drained), stop its worker and any embedded cluster."""
        with self._cv:
            if self._stopped:
                return False
            self._stopped, self._connected = True, False
        atexit.unregister(self.stop)
        timeout = float(self._config.exit_timeout_secs or 30)
        try:
            if self._worker is not None:
                for binding in self._bindings:
                    try:
                        self._worker.remove_model(binding, timeout)
                    except Exception as exc:
                        log.warning("removing model '%s': %s", binding.name, exc)
                self._worker.stop()
        finally:
            self._worker = None
            if self._cluster is not None:
                self._cluster.stop()
                self._cluster = None
            with self._cv:
                self._cv.notify_all()
        return True

    # -- internals ----------------------------------------------------------------------
    def _run_server(self) -> None:
        with self._cv:
            if not self._stopped:
                return
            self._stopped = False
        try:
            nats_url, credentials = self._config.nats_url, self._config.nats_credentials or ""
            if nats_url is None:
                self._cluster = EmbeddedCluster(self._config)
                nats_url = self._cluster.start()
                credentials = self._cluster.worker_credentials
            self._worker = InProcessWorker(nats_url, self._config.log_verbose or 0, credentials)
            self._worker.start()
        except BaseException:
            self.stop()
            raise

    def _serve_binding(self, binding: Binding) -> None:
        if self._worker is None:
            raise PyTritonValidationError("The server is not running: call run() or serve() first")
        self._worker.serve_model(binding)
        log.info("Infer function available as model: `/v2/models/%s`", binding.name)

    def _on_unrecoverable(self, exc: Exception) -> None:
        log.error("unrecoverable error in an inference function, stopping: %s", exc)
        threading.Thread(target=self.stop, name="shoal-pytriton-stop", daemon=True).start()


@contextlib.contextmanager
def _stop_signals(handler: Callable) -> Iterator[None]:
    """SIGINT and SIGTERM stop `serve()` cleanly (also where a shell started it with SIGINT ignored)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _validate_model_name(model_name: str) -> None:
    if not model_name:
        raise PyTritonValidationError("Model name cannot be empty")
    if not re.match(r"^[a-zA-Z0-9._-]+$", model_name):
        raise PyTritonValidationError(
            "Model name can only contain alphanumeric characters, dots, underscores and dashes"
        )

"""`shoal serve`: an embedded nats-server and every service as its own OS process.

The supervisor restarts a service that dies (and the embedded nats-server, on the same
port and JetStream store), prints Triton's model table once the models are loaded, and
on SIGINT/SIGTERM stops the services (gateway first, so no new requests arrive while the
rest drains), then nats-server, then sweeps any shared-memory segment this run left in
/dev/shm; the whole stop takes at most --exit-timeout-secs. Every child dies with the
supervisor even when it is SIGKILLed (shared/process/lifeline.py). See docs/reliability.md.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from services.gateway.http.listener import supervisor_socket
from services.repository.remote import is_remote
from shared.process import cache_dirs, lifeline
from shared.process import settings as s
from shared.process.natsserver import NatsServer, profile_port_from_env
from shared.process.settings import GatewaySettings, RepositorySettings, SchedulerSettings, WorkerSettings, to_argv
from shared.wire.records import ModelState
from shoal import announce, grpc_flags, layout_flags, openai_key, private_runtime, sagemaker_flags, vertex_flags
from shoal.gateway_http import UNANSWERED, GatewayHttp
from shoal.ports import busy_endpoint, reserve_serving_ports

log = logging.getLogger("shoal.serve")


class StartFailed(RuntimeError):
    """A service exited before the cluster was ready (`Cluster.fail_fast`)."""


class StartInterrupted(RuntimeError):
    """`wait_ready`'s cancel was set (SIGINT or SIGTERM while starting)."""


@dataclass
class Child:
    name: str
    service: str
    settings: s.BusSettings
    process: subprocess.Popen | None = None
    started: float = 0.0
    restarts: int = 0


@dataclass
class Cluster:
    """The Shoal services as processes on one NATS; used by `shoal serve` and by the tests."""

    gateway: GatewaySettings
    scheduler: SchedulerSettings | None  # None: no standalone scheduler (the gateways co-host theirs)
    repository: RepositorySettings
    workers: list[WorkerSettings]
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    env: dict[str, str] = field(default_factory=dict)
    supervise: bool = True  # restart services that exit (tests switch it off to see them gone)
    more_gateways: list[GatewaySettings] = field(default_factory=list)  # behind a load balancer
    more_schedulers: list[SchedulerSettings] = field(default_factory=list)  # replicas sharing the models
    # a service that exits before wait_ready returns ends the start (shoal serve: tritonserver exits when
    # anything fails at start) instead of being restarted, which repeats the failure until the ready timeout
    fail_fast: bool = False
    failure: str = ""
    # the private runtime directory and NATS identities each child is handed (shoal/private_runtime.py)
    runtime: private_runtime.Runtime | None = None
    children: list[Child] = field(default_factory=list)
    _ready: threading.Event = field(default_factory=threading.Event)
    _stopping: threading.Event = field(default_factory=threading.Event)

    def start(self) -> "Cluster":
        self.children = [Child("repository", "repository", self.repository)]
        if self.scheduler is not None:
            self.children.append(Child("scheduler", "scheduler", self.scheduler))
        self.children += [Child(f"scheduler-{i + 1}", "scheduler", s) for i, s in enumerate(self.more_schedulers)]
        self.children += [Child(f"worker-{i}", "worker", w) for i, w in enumerate(self.workers)]
        self.children.append(Child("gateway", "gateway", self.gateway))
        self.children += [Child(f"gateway-{i + 1}", "gateway", g) for i, g in enumerate(self.more_gateways)]
        for child in self.children:
            self._spawn(child)
        if self.supervise:
            threading.Thread(target=self._supervise, daemon=True).start()
        return self

    def restart(self, name: str) -> None:
        """Start a service again (after it was stopped or killed)."""
        child = self.child(name)
        if child.process and child.process.poll() is None:
            child.process.kill()
            child.process.wait()
        self._spawn(child)

    def _spawn(self, child: Child) -> None:
        env = {**os.environ, **self.env, "SHOAL_RUN_ID": self.run_id}
        runtime, settings = self.runtime, child.settings
        settings = private_runtime.assign(child.service, settings, runtime) if runtime is not None else settings
        argv = [sys.executable, "-m", "shoal.cli", child.service, *to_argv(settings)]
        child.process = lifeline.popen(argv, env=env, start_new_session=True)
        child.started = time.monotonic()

    def _supervise(self) -> None:
        while not self._stopping.wait(0.2):
            for child in self.children:
                code = child.process.poll() if child.process else None
                if code is None or self._stopping.is_set():
                    continue
                if self.fail_fast and not self._ready.is_set():
                    self.failure = f"{child.name} exited with code {code} while starting (its reason is logged above)"
                    child.process = None  # not restarted: wait_ready raises StartFailed
                    continue
                child.restarts += 1
                delay = min(5.0, 0.2 * 2 ** min(child.restarts, 5)) if time.monotonic() - child.started < 5 else 0.2
                log.error("%s exited with code %s; restarting in %.1fs", child.name, code, delay)
                if self._stopping.wait(delay):
                    return
                self._spawn(child)

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every service within `timeout` seconds in all: gateways first (they finish their
        in-flight requests while the rest still runs), then schedulers, workers, the repository;
        what has not stopped by the deadline is killed."""
        self._stopping.set()
        deadline = time.monotonic() + timeout
        for stage in (("gateway",), ("scheduler",), ("worker",), ("repository",)):
            running = [
                (c.name, c.process)
                for c in self.children
                if c.service in stage and c.process is not None and c.process.poll() is None
            ]
            for _, process in running:  # a stage stops in parallel: hundreds of models unload at once
                process.send_signal(signal.SIGTERM)
            for name, process in running:
                try:
                    process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop within the exit timeout (%ss); killing it", name, timeout)
                    process.kill()
                    process.wait()
        sweep_segments(self.run_id)

    @property
    def http(self) -> GatewayHttp:
        """The first gateway's HTTP API: its port, or with `--allow-http=false` its private socket."""
        gateway = self.gateway
        if gateway.allow_http or self.runtime is None:
            return GatewayHttp(gateway.http_port)
        return GatewayHttp(gateway.http_port, supervisor_socket(str(self.runtime.directory), gateway.gateway_id))

    def _get(self, path: str) -> int:
        from services.gateway.http.restricted import category, parse

        # a restricted API answers the supervisor too when it shows the header (--http-restricted-api)
        restriction = parse(self.gateway.http_restricted_api).get(category(path) or "")
        headers = {restriction.header: restriction.value} if restriction else {}
        return self.http.call("GET", path, headers=headers)[0]

    def wait_ready(self, timeout: float, cancel: threading.Event | None = None) -> list[dict]:
        """Block until the gateway answers and no model is still LOADING; returns the index.
        `cancel` set (SIGINT or SIGTERM while starting) ends the wait at once with StartInterrupted."""
        deadline = time.monotonic() + timeout
        index: list[dict] = []
        while time.monotonic() < deadline and not (cancel is not None and cancel.is_set()):
            if self.failure:
                raise StartFailed(self.failure)
            try:
                status, body = self.http.call("POST", "/v2/repository/index", b"")
                index = json.loads(body) if status == 200 else index
                loaded = status == 200 and all(e.get("state") != ModelState.LOADING for e in index)
                on_request = self.repository.model_control_mode in ("explicit", "on-demand")
                loaded = loaded and (on_request or all("state" in e for e in index))
                # the statistics endpoint answers only once a scheduler is on the bus
                if loaded and self._get("/v2/models/stats") == 200:
                    self._ready.set()
                    return index
            except (*UNANSWERED, ValueError):
                pass
            time.sleep(0.1)
        if cancel is not None and cancel.is_set():
            raise StartInterrupted("stopped while starting")
        raise TimeoutError(f"models not loaded after {timeout}s: {index}")


def keep_nats_alive(nats: NatsServer) -> None:
    """The embedded nats-server died: start it again on the same port with the same JetStream
    store (file-backed: configs, model states and leases survive); the services reconnect."""
    if nats.alive or nats.process is None:
        return
    log.error("nats-server exited with code %s; restarting it on port %d", nats.process.returncode, nats.port)
    try:
        nats.start()
    except (RuntimeError, TimeoutError, OSError) as exc:  # tried again on the next check
        log.error("cannot restart nats-server: %s", exc)


def sweep_segments(run_id: str) -> int:
    leftovers = glob.glob(f"/dev/shm/shoal_{run_id}_*")
    for path in leftovers:
        try:
            os.unlink(path)
        except OSError:
            pass
    return len(leftovers)


def build_cluster(args: argparse.Namespace, nats_url: str, repository: Path | str | list[Path | str]) -> Cluster:
    """`repository`: one model repository, or several (--model-repository given more than once)."""
    common = {"nats_url": nats_url, "log_verbose": args.log_verbose, "trace_config": args.trace["config"]}
    gateway = GatewaySettings(
        **common,
        id=args.id,
        http_address=args.http_address,
        http_port=args.http_port,
        reuse_http_port=args.reuse_http_port,
        metrics_address=args.metrics_address,
        log_started=False,  # said below, once the models are loaded (as tritonserver)
        metrics_port=args.metrics_port,
        openai_address=args.openai_address,
        openai_port=args.openai_port,
        openai_api_key_file=args.openai_api_key_file,
        tool_call_parser=args.tool_call_parser,
        allow_metrics=args.allow_metrics,
        http_max_input_size=args.http_max_input_size,
        http_restricted_api=args.http_restricted_api,
        http_header_forward_pattern=args.http_header_forward_pattern,
        allow_http=args.allow_http is not False,
        request_timeout_s=args.request_timeout_secs,
        tensor_transport=args.tensor_transport,
        strict_readiness=args.strict_readiness,
        allow_client_shm=args.allow_client_shm,
        exit_timeout_s=args.exit_timeout_secs,
        **{
            f"trace_{key.replace('-', '_')}": args.trace[key]
            for key in ("file", "level", "rate", "count", "log-frequency")
        },
        cache_bytes=args.cache_bytes,
        cache_redis=args.cache_redis,
        allow_cpu_metrics=args.allow_cpu_metrics is not False,
        allow_gpu_metrics=args.allow_gpu_metrics is not False,
        **args.metrics,
        **grpc_flags.gateway_settings(args),
        **vertex_flags.gateway_settings(args),
        **sagemaker_flags.gateway_settings(args),
        cohost_scheduler=args.cohost_scheduler,
        rate_limit=args.rate_limit,
        rate_limit_resource=args.rate_limit_resource,
        prefix_routing=args.prefix_routing,
    )
    gateway = layout_flags.with_local_channel(gateway, args)
    repo = RepositorySettings(
        **common,
        model_repository=[str(r) for r in (repository if isinstance(repository, list) else [repository])],
        model_namespacing=bool(getattr(args, "model_namespacing", False)),
        model_control_mode=args.model_control_mode,
        load_model=args.load_model,
        disable_auto_complete_config=args.disable_auto_complete_config,
        strict_model_config=args.strict_model_config,
        model_config_name=args.model_config_name,
        repository_poll_secs=args.repository_poll_secs,
        model_files=args.model_files,  # the workers it starts share its host: no copy unless asked
        unload_timeout_s=args.exit_timeout_secs,
        backend_directory=args.backend_directory,
        backend_config=args.backend_config,
        pin_model=args.pin_model,
    )
    workers = [
        layout_flags.with_local_channel(
            WorkerSettings(
                **common,
                tensor_transport=args.tensor_transport,
                python_isolation=args.python_isolation,
                model_load_thread_count=args.model_load_thread_count,
                model_load_retry_count=args.model_load_retry_count,
                backend_directory=args.backend_directory,
                backend_config=args.backend_config,
                model_memory_budget=args.model_memory_budget,
                max_loaded_models=args.max_loaded_models,
                # its schedulers stop before its workers (`Cluster.stop`): nothing sends them batches then
                drain_timeout_s=0.0,
            ),
            args,
        )
        for _ in range(args.workers)
    ]
    gateway, more_gateways = layout_flags.port_sharing_gateways(gateway, args.gateways)
    # replicas share the models by lease (services/scheduler/replicas/): one hot model is still one
    # scheduler's, many models spread over them (docs/performance.md, "Scale"). Each gateway hosts
    # one unless --cohost-scheduler=false; --schedulers adds standalone ones (docs/design.md, "Co-hosting")
    standalone = [
        SchedulerSettings(
            **common,
            scheduler_id=uuid.uuid4().hex[:12],
            rate_limit=args.rate_limit,
            rate_limit_resource=args.rate_limit_resource,
            prefix_routing=args.prefix_routing,
        )
        for _ in range(args.schedulers)
    ]
    scheduler, replicas = (standalone[0], standalone[1:]) if standalone else (None, [])
    env = openai_key.environment(args)  # the key in the gateways' environment, never on their command lines
    return Cluster(gateway, scheduler, repo, workers, env=env, more_gateways=more_gateways, more_schedulers=replicas)


def apply_log_flags(cluster: Cluster, args: argparse.Namespace) -> None:
    """--log-info/--log-warning/--log-error/--log-format, applied in every service through the
    logging extension (the same path `POST /v2/logging` takes)."""
    body = {
        key: getattr(args, key)
        for key in ("log_info", "log_warning", "log_error", "log_format")
        if getattr(args, key) is not None
    }
    if not body:
        return
    status, answer = cluster.http.call("POST", "/v2/logging", json.dumps(body).encode(), timeout=10)
    if status != 200:
        raise RuntimeError(f"the log settings were refused: {answer.decode(errors='replace')}")


class StopSignals:
    """SIGINT and SIGTERM as a flag, from before anything starts: an interrupt while starting
    stops what has started (the lifeline would only kill it) instead of raising mid-step."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum = 0
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._received)

    def _received(self, signum: int, _frame: object) -> None:
        self.signum = self.signum or signum
        self.event.set()


def example_repository(args: argparse.Namespace) -> Path:
    from services.repository.examples import write_examples
    from services.repository.llm_examples import write_llm_examples

    repository = write_examples(cache_dirs.example_models())
    # the language models, with the `llm` extra, only for the OpenAI front end (docs/openai.md)
    llms = write_llm_examples(repository, wanted=bool(args.openai_port))
    log.info("no --model-repository: serving the example repository in %s", repository)
    if args.openai_port and not llms:
        log.warning("the example language models need the llm extra: pip install 'shoal[llm]'")
    return repository


def serve(args: argparse.Namespace) -> int:
    from shared.process.runtime import configure_logging
    from shoal.compiled_modules import describe
    from shoal.topology import forget_serve, record_serve

    if args.log_file:
        try:  # every service inherits stderr: the whole cluster's log goes to the file, as tritonserver's
            log_fd = os.open(args.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            print(f"error: failed to open log file '{args.log_file}': {exc.strerror}", file=sys.stderr)
            return 1
        os.dup2(log_fd, 2)
        os.close(log_fd)
    configure_logging("serve", args.log_verbose)
    log.info("%s", describe())  # compiled or pure Python: docs/performance.md, "The compiled build"
    for warning in getattr(args, "flag_warnings", []):
        log.warning("%s", warning)
    repositories: list[Path | str] = []
    for given in args.model_repository or []:  # a cloud bucket is read by the repository service
        # as typed: with --model-namespacing it is the namespace (Triton's); the services share this cwd
        if not is_remote(given) and not Path(given).is_dir():
            print(f"error: model repository '{Path(given).resolve()}' is not a directory", file=sys.stderr)
            return 1
        repositories.append(given)
    if not repositories:
        repositories = [example_repository(args)]
    # a port taken, or OpenAI keys that cannot be read: said now, not by a service that cannot start
    problem = busy_endpoint(args) or openai_key.problem(args)
    if problem:
        log.error("%s", problem)
        return 1
    signals = StopSignals()
    nats: NatsServer | None = None
    cluster: Cluster | None = None
    state: Path | None = None
    runtime: private_runtime.Runtime | None = None
    code = 0
    try:
        # the embedded nats-server admits only the identities made here (docs/security.md)
        runtime = private_runtime.make(not args.nats_url, args.nats_credentials)
        if args.nats_url:
            nats_url = args.nats_url
        else:
            reserve_serving_ports(args)  # not for nats-server, even if free now
            nats = NatsServer(
                monitor_port=args.nats_monitor_port,
                authorization=runtime.authorization(),
                profile_port=profile_port_from_env(),
            ).start()
            nats_url = nats.url
            log.info("embedded nats-server at %s (monitoring http://127.0.0.1:%d)", nats.url, nats.monitor_port)
        cluster = build_cluster(args, nats_url, repositories)
        cluster.fail_fast = True
        cluster.runtime = runtime
        cluster.start()
        state = record_serve(args.http_port, nats_url, ", ".join(str(r) for r in repositories), runtime.operator)
        index = cluster.wait_ready(args.ready_timeout_secs, cancel=signals.event)
        print(announce.model_table(index), flush=True)
        apply_log_flags(cluster, args)
        failed = [e for e in index if e.get("state") == ModelState.UNAVAILABLE]
        if args.exit_on_error and failed:
            # Triton's --exit-on-error=true; without the flag Shoal keeps serving the models that loaded
            log.error("exiting: %d model version(s) failed to load (--exit-on-error=true)", len(failed))
            return 1
        announce.started(args)
        while not signals.event.wait(0.5):
            if nats is not None:
                keep_nats_alive(nats)
    except StartInterrupted:
        code = 128 + signals.signum  # stopped by the user before it was ready: what a shell reports for it
    except (TimeoutError, StartFailed) as exc:
        log.error("%s", exc)
        code = 1
    finally:
        log.info("shutting down")
        if cluster is not None:
            cluster.stop(timeout=max(1.0, args.exit_timeout_secs - 1.0))
        if nats is not None:
            nats.stop(timeout=1.0)
        if state is not None:
            forget_serve(state)
        if runtime is not None:
            private_runtime.remove(runtime)
    return code

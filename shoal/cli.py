"""The `shoal` command: `serve` (everything), one service each, `example`.

`shoal serve` takes tritonserver's flag names (`--flag=value` or `--flag value`,
booleans as true/false/on/off/1/0). A tritonserver flag for a feature Shoal does
not have is refused with a message saying so, never silently ignored.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shared.process import settings as s
from shared.process.settings_env import BaseSettings
from shoal import grpc_flags, layout_flags, sagemaker_flags, unimplemented_flags, vertex_flags

SERVICES: dict[str, type[BaseSettings]] = {
    "gateway": s.GatewaySettings,
    "scheduler": s.SchedulerSettings,
    "worker": s.WorkerSettings,
    "repository": s.RepositorySettings,
}

# boolean flags that Shoal accepts only with the value it already behaves as: flag -> (allowed, why, help)
FIXED_FLAGS: dict[str, tuple[bool | None, str, str]] = {
    "allow_http": (None, "", s.help_text(s.GatewaySettings.model_fields["allow_http"])),
    "allow_gpu_metrics": (None, "", s.help_text(s.GatewaySettings.model_fields["allow_gpu_metrics"])),
    "allow_cpu_metrics": (None, "", s.help_text(s.GatewaySettings.model_fields["allow_cpu_metrics"])),
    "exit_on_error": (None, "", "exit when a model fails to load at start (default: false; tritonserver's is true)"),
    "log_info": (None, "", "log INFO messages (default: true)"),
    "log_warning": (None, "", "log WARNING messages (default: true)"),
    "log_error": (None, "", "log ERROR messages (default: true)"),
}
_FIXED_DEFAULTS: dict[str, str] = {}

G, R, S, W = s.GatewaySettings, s.RepositorySettings, s.SchedulerSettings, s.WorkerSettings
# tritonserver's flag -> the setting it is (its default and help come from the settings model)
SETTING_FLAGS: list[tuple[str, type[BaseSettings], str]] = [
    ("--model-control-mode", R, "model_control_mode"),
    ("--model-namespacing", R, "model_namespacing"),
    ("--load-model", R, "load_model"),
    ("--repository-poll-secs", R, "repository_poll_secs"),
    ("--strict-readiness", G, "strict_readiness"),
    ("--disable-auto-complete-config", R, "disable_auto_complete_config"),
    ("--model-config-name", R, "model_config_name"),
    ("--strict-model-config", R, "strict_model_config"),
    ("--exit-timeout-secs", G, "exit_timeout_s"),
    ("--model-load-thread-count", W, "model_load_thread_count"),
    ("--model-load-retry-count", W, "model_load_retry_count"),
    ("--backend-directory", W, "backend_directory"),
    ("--backend-config", W, "backend_config"),
    ("--id", G, "id"),
    ("--http-address", G, "http_address"),
    ("--http-port", G, "http_port"),
    ("--reuse-http-port", G, "reuse_http_port"),
    ("--http-max-input-size", G, "http_max_input_size"),
    ("--http-restricted-api", G, "http_restricted_api"),
    ("--http-header-forward-pattern", G, "http_header_forward_pattern"),
    ("--metrics-address", G, "metrics_address"),
    ("--metrics-port", G, "metrics_port"),
    ("--allow-metrics", G, "allow_metrics"),
    ("--openai-address", G, "openai_address"),  # Triton's OpenAI front end's flags
    ("--openai-port", G, "openai_port"),
    ("--openai-api-key", G, "openai_api_key"),
    ("--openai-api-key-file", G, "openai_api_key_file"),
    ("--tool-call-parser", G, "tool_call_parser"),
    ("--allow-client-shm", G, "allow_client_shm"),
    ("--log-verbose", G, "log_verbose"),
    ("--rate-limit", S, "rate_limit"),
    ("--rate-limit-resource", S, "rate_limit_resource"),
    # Shoal's own
    ("--prefix-routing", S, "prefix_routing"),
    ("--tensor-transport", G, "tensor_transport"),
    ("--request-timeout-secs", G, "request_timeout_s"),
    ("--python-isolation", W, "python_isolation"),
    ("--model-memory-budget", W, "model_memory_budget"),
    ("--max-loaded-models", W, "max_loaded_models"),
    ("--pin-model", R, "pin_model"),
]
# the older trace flags: None when not given, so that --trace-config settings stay
TRACE_FLAGS = [
    ("--trace-file", "trace_file"),
    ("--trace-level", "trace_level"),
    ("--trace-rate", "trace_rate"),
    ("--trace-count", "trace_count"),
    ("--trace-log-frequency", "trace_log_frequency"),
]


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shoal serve", description="Run Shoal (tritonserver-compatible flags).")
    p.add_argument(
        "--model-repository",
        "--model-store",
        action="append",
        default=None,
        help="model repository, a folder or a bucket; repeatable: every one is served (default: the example "
        "repository, generated on first use in ~/.cache/shoal/models)",
    )
    for flag, model, field in SETTING_FLAGS:
        s.add_setting(p, flag, model, field)
    p.add_argument(
        "--log-format", choices=["default", "ISO8601"], default=None, help="log line format (default: default)"
    )
    p.add_argument(
        "--metrics-config",
        action="append",
        default=[],
        help="<key>=<value> as tritonserver: counter_latencies, summary_latencies, histogram_latencies, "
        "summary_quantiles, repeatable (default: none)",
    )
    p.add_argument(
        "--cache-config",
        action="append",
        default=[],
        help="local,size=<bytes> or redis,<key>=<value> (host, port, user, password, db, ...; repeatable): "
        "the response cache (default: none)",
    )
    p.add_argument(
        "--response-cache-byte-size",
        type=int,
        default=None,
        help="older form of --cache-config local,size=<bytes> (default: 0, no cache)",
    )
    p.add_argument(
        "--trace-config",
        action="append",
        default=[],
        help="[<mode>,]<setting>=<value>: rate, level, count, mode (triton or opentelemetry); triton,file=..., "
        "triton,log-frequency=...; opentelemetry,url=..., opentelemetry,resource=<key>=<value>, "
        "opentelemetry,bsp_max_queue_size|bsp_schedule_delay|bsp_max_export_batch_size=...; repeatable (default: none)",
    )
    for flag, field in TRACE_FLAGS:
        s.add_setting(p, flag, G, field, default=None, **({"action": "append"} if field == "trace_level" else {}))
    for name, (_, _, help) in FIXED_FLAGS.items():
        flag = "--" + name.replace("_", "-")
        text = help if "(default" in help else f"{help} (default: {_FIXED_DEFAULTS[name]})"
        p.add_argument(flag, type=s.parse_bool, nargs="?", const=True, default=None, metavar="BOOL", help=text)
    grpc_flags.add_flags(p)
    vertex_flags.add_flags(p)
    sagemaker_flags.add_flags(p)
    unimplemented_flags.add_flags(p)
    p.add_argument(
        "--log-file",
        default=None,
        help="write the log of every service to this file (appended) instead of stderr (default: none, stderr)",
    )
    # Shoal's own
    p.add_argument(
        "--nats-url",
        default=None,
        help="use this NATS instead of starting one (default: none: an embedded nats-server on a free port)",
    )
    p.add_argument(
        "--nats-credentials",
        default="",
        help="with --nats-url: the directory `shoal credentials --out` wrote, each service's identity "
        "(default: none; the embedded nats-server gets new ones at each start, docs/security.md)",
    )
    p.add_argument(
        "--nats-monitor-port",
        type=int,
        default=0,
        help="embedded nats-server monitoring port (default: 0, a free port)",
    )
    layout_flags.add(p)
    p.add_argument(
        "--ready-timeout-secs",
        type=float,
        default=300.0,
        help="how long to wait at start for the models to load (default: 300.0)",
    )
    return p


def parse_serve(argv: list[str]) -> argparse.Namespace:
    unimplemented_flags.refuse(argv)
    args = serve_parser().parse_args(argv)
    args.flag_warnings = unimplemented_flags.check(args)
    for name, (allowed, why, _) in FIXED_FLAGS.items():
        value = getattr(args, name)
        if value is not None and allowed is not None and value != allowed:
            raise SystemExit(f"shoal serve: --{name.replace('_', '-')}={str(value).lower()} is not supported: {why}")
    if args.load_model and args.model_control_mode not in ("explicit", "on-demand"):
        raise SystemExit("shoal serve: --load-model is only allowed with --model-control-mode=explicit or on-demand")
    try:
        from shared.memory.footprint import parse_budget

        parse_budget(args.model_memory_budget)
    except ValueError as exc:
        raise SystemExit(f"shoal serve: --model-memory-budget: {exc}") from None
    if "*" in args.load_model and len(args.load_model) > 1:
        raise SystemExit("shoal serve: --load-model=* must be the only --load-model")
    try:
        from services.scheduler.batching.ratelimit import parse_resources

        parse_resources(args.rate_limit_resource)
    except ValueError as exc:
        raise SystemExit(f"shoal serve: {exc}") from None
    grpc_flags.check(args)
    vertex_flags.check(args, argv)
    sagemaker_flags.check(args)
    try:
        from shared.config.backend_config import parse as parse_backend_config

        parse_backend_config(args.backend_config)
    except ValueError as exc:
        raise SystemExit(f"shoal serve: {exc}") from None
    try:
        from services.gateway.http.restricted import parse as parse_restricted

        parse_restricted(args.http_restricted_api)
    except ValueError as exc:
        raise SystemExit(f"shoal serve: {exc}") from None
    args.trace = trace_settings(args)
    args.metrics = metrics_config(args.metrics_config)
    args.cache_bytes, args.cache_redis = cache_size(args)
    layout_flags.check(args)
    if args.model_load_thread_count < 1:
        raise SystemExit("shoal serve: --model-load-thread-count must be at least 1")
    return args


def cache_size(args: argparse.Namespace) -> tuple[int, list[str]]:
    """`--cache-config local,size=N` (or the older `--response-cache-byte-size=N`): bytes; or
    `--cache-config redis,<key>=<value>` (repeatable): the Redis cache's settings."""
    if args.cache_config and args.response_cache_byte_size is not None:
        raise SystemExit("shoal serve: --cache-config and --response-cache-byte-size can not be used together")
    if args.response_cache_byte_size is not None:
        return args.response_cache_byte_size, []
    size, redis, kinds = 0, [], set()
    for entry in args.cache_config:
        kind, _, setting = entry.partition(",")
        kinds.add(kind)
        if kind == "redis":
            redis.append(setting)
            continue
        if kind != "local":
            raise SystemExit(f"shoal serve: --cache-config '{kind}' is not supported (the 'local' and 'redis' caches)")
        key, _, value = setting.partition("=")
        if key != "size" or not value.isdigit():
            raise SystemExit(f"shoal serve: --cache-config local supports 'size=<bytes>', got '{setting}'")
        size = int(value)
    if len(kinds) > 1:  # tritonserver runs one cache
        raise SystemExit("shoal serve: --cache-config names more than one cache (local and redis)")
    if redis:
        from inference.redis_cache import parse_options

        try:
            parse_options(redis)
        except ValueError as exc:
            raise SystemExit(f"shoal serve: {exc}") from None
    return size, redis


def metrics_config(entries: list[str]) -> dict[str, object]:
    """`--metrics-config counter_latencies=false|summary_latencies=true|histogram_latencies=true|summary_quantiles=..`"""
    config: dict[str, object] = {}
    for entry in entries:
        key, _, value = entry.partition("=")
        if key in ("counter_latencies", "summary_latencies", "histogram_latencies"):
            try:
                config[key] = s.parse_bool(value)
            except argparse.ArgumentTypeError as exc:
                raise SystemExit(f"shoal serve: --metrics-config {key}: {exc}") from None
        elif key == "summary_quantiles":
            config[key] = value
        else:
            raise SystemExit(
                f"shoal serve: --metrics-config '{key}' is not supported "
                "(counter_latencies, summary_latencies, histogram_latencies, summary_quantiles)"
            )
    return config


def trace_settings(args: argparse.Namespace) -> dict[str, object]:
    """tritonserver's `--trace-config [mode,]key=value` and the older `--trace-*` flags.
    `config`: the entries every service gets in opentelemetry mode (the mode and its exporter's
    settings: each service exports its own spans); none in triton mode."""
    from shared.tracing import trace_settings as tracing

    trace: dict[str, object] = {"file": "", "level": "OFF", "rate": 1000, "count": -1, "log-frequency": 0}
    levels: list[str] = []
    try:
        mode = tracing.mode(args.trace_config)
        for entry in args.trace_config:
            section, key, value = tracing.split(entry)
            if section == "opentelemetry" or key == "mode":
                continue
            if section == "triton" and key not in ("file", "log-frequency"):
                continue  # tritonserver keeps a mode's unknown settings and uses none of them
            if key == "level":
                levels.append(_trace_level(value))
            elif key in ("file", "rate", "count", "log-frequency"):
                trace[key] = value if key == "file" else int(value)
            else:
                raise SystemExit(f"shoal serve: unknown --trace-config setting '{key}'")
        otel = tracing.opentelemetry(args.trace_config) if mode == "opentelemetry" else None
    except (tracing.TraceConfigError, ValueError) as exc:
        raise SystemExit(f"shoal serve: {exc}") from None
    for key, value in (
        ("file", args.trace_file),
        ("rate", args.trace_rate),
        ("count", args.trace_count),
        ("log-frequency", args.trace_log_frequency),
    ):
        if value is not None:
            trace[key] = value
    levels += [_trace_level(level) for level in args.trace_level or []]
    if "OFF" in levels:  # tritonserver: an explicit OFF disables tracing whatever else is given
        levels = ["OFF"]
    if levels:
        trace["level"] = ",".join(dict.fromkeys(levels))
    trace["config"] = (
        ["mode=opentelemetry", *(f"opentelemetry,{k}={v}" for k, v in otel.entries)] if otel is not None else []
    )
    return trace


def _trace_level(value: str) -> str:
    """tritonserver's `ParseTraceLevelOption`."""
    lowered = value.lower()
    if lowered in ("false", "off"):
        return "OFF"
    if lowered in ("true", "on", "min", "max", "timestamps"):
        return "TIMESTAMPS"
    if lowered == "tensors":
        return "TENSORS"
    raise SystemExit(f"shoal serve: invalid value for trace level option: {value}")


def _service(name: str, argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog=f"shoal {name}")
    s.add_arguments(parser, SERVICES[name])
    settings = s.from_namespace(SERVICES[name], parser.parse_args(argv))
    from shared.bus.nats_import import import_nats_without_websockets, wants_websockets

    if not wants_websockets(settings.nats_url.split(",")):
        import_nats_without_websockets()  # before anything imports nats-py: a faster start
    if isinstance(settings, s.WorkerSettings) and settings.parent_pid:  # a python model's own process
        from services.worker.python.processes.child_startup import name_process, process_name

        name_process(process_name(settings.models[0] if settings.models else "", settings.instance_index))
    from shared.process.runtime import configure_logging, run_service

    configure_logging(name, settings.log_verbose)
    module = __import__(f"services.{name}.service", fromlist=["run"])
    run_service(lambda stop: module.run(settings, stop), name)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: shoal {serve|status|autoscale|gateway|scheduler|worker|repository|example|perf|analyze} [options]"
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        print("  serve       start nats-server (embedded) and every service; tritonserver's flags")
        print("  gateway     the HTTP/gRPC front end  scheduler   queues and batching")
        print("  worker      model instances          repository  the model repository")
        print("  status      the live topology: services, workers, models, queues")
        print("  autoscale   scale a Docker deployment's workers from its queues (docs/scaling.md)")
        print("  credentials DIR: NATS identities for compose or another host (docs/security.md)")
        print("  example DIR write the example model repository into DIR")
        print("  perf        measure a model like perf_analyzer; analyze  find its best configuration")
        raise SystemExit(0)
    command, rest = argv[0], argv[1:]
    if command == "serve":
        from shoal.supervisor import serve

        raise SystemExit(serve(parse_serve(rest)))
    if command in SERVICES:
        _service(command, rest)
        return
    if command == "status":
        from shoal.topology import main as status_main

        status_main(rest)
        return
    if command == "credentials":  # docs/security.md
        from shoal.credentials_cli import main as credentials_main

        raise SystemExit(credentials_main(rest))
    if command == "autoscale":  # docs/scaling.md
        from shoal.autoscale.controller import main as autoscale_main

        raise SystemExit(autoscale_main(rest))
    if command in ("perf", "analyze"):  # docs/perf-and-analyze.md
        raise SystemExit(__import__(f"shoal.{command}.cli", fromlist=["main"]).main(rest))
    if command == "example":
        if len(rest) != 1:
            raise SystemExit("usage: shoal example DIR")
        from services.repository.examples import write_examples

        print(write_examples(Path(rest[0])))
        return
    raise SystemExit(f"shoal: unknown command '{command}'\n{usage}")


if __name__ == "__main__":
    main()

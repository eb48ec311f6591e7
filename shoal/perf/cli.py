"""`shoal perf`: perf_analyzer's core flags (docs/perf-and-analyze.md)."""

from __future__ import annotations

import argparse
import sys

from shoal.perf.options import PerfError, PerfOptions, parse_range, parse_shape

DEFAULT_URLS = {"http": "localhost:8000", "grpc": "localhost:8001"}


def add_load_arguments(p: argparse.ArgumentParser) -> None:
    """The flags `shoal perf` and `shoal analyze` share."""
    p.add_argument("-m", "--model-name", dest="model", required=True)
    p.add_argument("-u", "--url", default=None, help="host:port (default localhost:8000, 8001 for grpc)")
    p.add_argument("-i", "--protocol", choices=["http", "grpc"], default="http", type=str.lower)
    p.add_argument("-b", "--batch-size", type=int, default=1)
    p.add_argument("--streaming", action="store_true", help="gRPC only: send requests on bidirectional streams")
    p.add_argument("--shape", action="append", default=[], help="NAME:d1,d2,... for variable dims")
    p.add_argument("--input-data", default="random", help="zero, random, or a perf_analyzer JSON file")
    p.add_argument("-p", "--measurement-interval", type=int, default=None, metavar="MS", help="window length")
    p.add_argument("-s", "--stability-percentage", type=float, default=10.0)
    p.add_argument("-r", "--max-trials", type=int, default=10)
    p.add_argument("--percentile", type=int, default=None, help="stabilise on this latency percentile")
    p.add_argument("--request-timeout-secs", type=float, default=60.0)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shoal perf", description="Measure a model like perf_analyzer does.")
    add_load_arguments(p)
    p.add_argument("-x", "--model-version", default="")
    p.add_argument("--concurrency-range", default=None, metavar="START:END:STEP")
    p.add_argument("--request-rate-range", default=None, metavar="START:END:STEP")
    p.add_argument("-l", "--latency-threshold", type=float, default=0.0, metavar="MS", help="stop past this p99")
    p.add_argument("--shared-memory", choices=["none", "system"], default="none")
    p.add_argument("--output-shared-memory-size", type=int, default=102400)
    p.add_argument("-f", "--latency-report-file", dest="csv", default=None, help="CSV, perf_analyzer's columns")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="throughput vs p99 latency (needs shoal[perf])")
    return p


def options_from(args: argparse.Namespace, **extra: object) -> PerfOptions:
    if args.batch_size < 1:
        raise PerfError("-b must be at least 1")
    if args.streaming and args.protocol != "grpc":
        raise PerfError("streaming is only allowed with gRPC protocol")
    return PerfOptions(
        model=args.model,
        url=args.url or DEFAULT_URLS[args.protocol],
        protocol=args.protocol,
        streaming=args.streaming,
        batch_size=args.batch_size,
        shapes=dict(parse_shape(s) for s in args.shape),
        input_data=args.input_data,
        window_ms=args.measurement_interval or 5000,
        stability_pct=args.stability_percentage,
        max_trials=max(args.max_trials, 3),
        percentile=args.percentile,
        request_timeout_s=args.request_timeout_secs,
        **extra,  # type: ignore[arg-type]
    )


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        if args.concurrency_range and args.request_rate_range:
            raise PerfError("give --concurrency-range or --request-rate-range, not both")
        options = options_from(
            args,
            model_version=args.model_version,
            concurrency=parse_range(args.concurrency_range or "1"),
            request_rates=parse_range(args.request_rate_range, float) if args.request_rate_range else [],
            latency_limit_ms=args.latency_threshold,
            shared_memory=args.shared_memory,
            output_shm_size=args.output_shared_memory_size,
        )
        from shoal.perf.perf_report import run_and_report

        return run_and_report(options, args.csv, args.plot)
    except PerfError as exc:
        print(f"shoal perf: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("shoal perf: interrupted", file=sys.stderr)
        return 130

"""`shoal analyze`: find a model's best configuration on a running server (explicit model control mode)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shoal.analyze.search import Limits
from shoal.perf.cli import add_load_arguments, options_from
from shoal.perf.options import PerfError, parse_range


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shoal analyze",
        description="Try instance counts, batch sizes and dynamic batching settings as config overrides; "
        "recommend the fastest under a latency budget. The original configuration is restored at the end.",
    )
    add_load_arguments(p)
    p.add_argument("--max-minutes", type=float, default=10.0, help="time budget for the search")
    p.add_argument("--latency-budget-ms", type=float, default=None, help="p99 latency budget")
    p.add_argument("--concurrency", default=None, metavar="START:END:STEP", help="default: 1, 2, 4, ... to a plateau")
    p.add_argument("--max-instances", type=int, default=5)
    p.add_argument("--max-batch-size", type=int, default=128)
    p.add_argument("--output", "-o", default="shoal-analyze", help="directory for config.pbtxt, CSV, report")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.protocol != "http":
        print("shoal analyze: loads configurations over HTTP; measuring over gRPC is not supported", file=sys.stderr)
        return 2
    from shoal.analyze.analysis_report import write_outputs
    from shoal.analyze.live_search import AnalyzeOptions, analyze
    from shoal.perf.run import run_loop

    def log(line: str) -> None:
        print(f"shoal analyze: {line}", file=sys.stderr, flush=True)

    try:
        perf = options_from(args)
        if args.measurement_interval is None:
            perf.window_ms = 2000  # shorter windows than perf's: many points within the time budget
        opts = AnalyzeOptions(
            perf=perf,
            max_minutes=args.max_minutes,
            latency_budget_ms=args.latency_budget_ms,
            concurrency=parse_range(args.concurrency) if args.concurrency else None,
            limits=Limits(args.max_instances, args.max_batch_size),
        )
        analysis = run_loop(analyze(opts, log))
    except PerfError as exc:
        log(str(exc))
        return 1
    except KeyboardInterrupt:  # before the search's own handler is installed
        return 130
    if analysis.stopped == "interrupted":
        log("interrupted; the original configuration is back")
        return 130
    for path in write_outputs(analysis, args.latency_budget_ms, Path(args.output)):
        print(f"wrote {path}")
    if analysis.best is None:
        log("no configuration met the latency budget: no config.pbtxt written")
    return 0

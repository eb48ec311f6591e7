"""The search against a running server: load each candidate, sweep its concurrencies, restore the original.

The original configuration comes back however the run ends (done, out of time, an error, Ctrl-C or
SIGTERM): reload from the repository, and if that is not the configuration found at the start (it was
itself an override), load that one as an override.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from shoal.analyze.configs import Candidate, apply, candidate_of
from shoal.analyze.points import Point, score
from shoal.analyze.repository import Repository
from shoal.analyze.search import Limits, QuickSearch
from shoal.perf.options import PerfError, PerfOptions
from shoal.perf.run import measure

Log = Callable[[str], None]


@dataclass
class AnalyzeOptions:
    perf: PerfOptions  # the load for every point (model, url, inputs, windows); its levels are ignored
    max_minutes: float = 5.0
    latency_budget_ms: float | None = None
    concurrency: list[int] | None = None  # None: 1, 2, 4, ... while throughput rises
    limits: Limits = field(default_factory=Limits)
    max_concurrency: int = 256


@dataclass
class Analysis:
    original: dict
    default: Candidate
    points: list[Point] = field(default_factory=list)
    configs: dict[Candidate, dict] = field(default_factory=dict)
    scores: dict[Candidate, float | None] = field(default_factory=dict)
    best: Candidate | None = None
    stopped: str = "search complete"


def auto_levels(c: Candidate, cap: int) -> list[int]:
    top = min(cap, max(2, 2 * c.instances * max(c.max_batch_size, 1)))
    levels, level = [], 1
    while level <= top:
        levels.append(level)
        level *= 2
    return levels


async def sweep(c: Candidate, opts: AnalyzeOptions) -> list[Point]:
    """The candidate at each concurrency: stop past the latency budget, or (automatic levels) at a plateau."""
    points: list[Point] = []
    for level in opts.concurrency or auto_levels(c, opts.max_concurrency):
        options = replace(opts.perf, concurrency=[level], request_rates=[], latency_limit_ms=0.0)
        point = Point(c, (await measure(options))[0])
        points.append(point)
        if opts.latency_budget_ms is not None and point.p99_ms > opts.latency_budget_ms:
            break
        # a plateau: two levels in a row not 5 % above the best before them (one alone can be noise)
        if opts.concurrency is None and len(points) > 2:
            if max(p.throughput for p in points[-2:]) < 1.05 * max(p.throughput for p in points[:-2]):
                break
    return points


async def restore(repo: Repository, original: dict) -> None:
    await repo.load()
    if await repo.config() != original:
        await repo.load(original)


async def analyze(opts: AnalyzeOptions, log: Log) -> Analysis:
    """The search; Ctrl-C or SIGTERM at any point ends it with `stopped == "interrupted"` and the
    original configuration back.

    The signals are this run's own, not asyncio.Runner's: the runner turns SIGINT into one cancel
    of the main task and reports KeyboardInterrupt only if that cancel comes out of the task, and a
    client library under it may swallow a cancel (an interrupted run exited 0, issue 28 item 17).
    Here the interrupt is a flag, read whatever the cancel became, and it cancels only the search
    task: the restore below runs in a task no interrupt cancels.
    """
    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()
    searching: asyncio.Task | None = None

    def interrupt() -> None:
        interrupted.set()
        if searching is not None:
            searching.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupt)
    repo = Repository(opts.perf.url, opts.perf.model)
    try:
        original = await repo.config()
        analysis = Analysis(original, candidate_of(original))
        searching = asyncio.create_task(_search(repo, opts, analysis, log, interrupted))
        try:
            await searching
        except asyncio.CancelledError:
            if not interrupted.is_set():
                raise
        finally:
            log("restoring the original configuration")
            await restore(repo, original)
            if interrupted.is_set():
                analysis.stopped = "interrupted"
        return analysis
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await repo.close()


async def _search(
    repo: Repository, opts: AnalyzeOptions, analysis: Analysis, log: Log, interrupted: asyncio.Event
) -> None:
    search = QuickSearch(analysis.default, opts.limits)
    deadline = time.monotonic() + opts.max_minutes * 60
    last = 0.0  # how long the last candidate took: the next one needs about as long
    while not interrupted.is_set() and (candidate := search.next()) is not None:
        if time.monotonic() + last > deadline:
            analysis.stopped = f"time budget ({opts.max_minutes:g} min) reached"
            break
        began = time.monotonic()
        log(f"trying {candidate.name}")
        config = apply(analysis.original, candidate)
        try:
            await repo.load(config)
            points = await sweep(candidate, opts)
        except PerfError as exc:
            log(f"{candidate.name}: skipped: {exc}")
            search.record(candidate, None)
            analysis.scores[candidate] = None
            continue
        value = score(points, opts.latency_budget_ms)
        search.record(candidate, value)
        analysis.points += points
        analysis.configs[candidate] = config
        analysis.scores[candidate] = value
        last = time.monotonic() - began
        log(f"{candidate.name}: {value:.1f} infer/s ({len(points)} points, {last:.0f} s)")
    best = search.best()
    analysis.best = best[0] if best and best[1] > 0 else None

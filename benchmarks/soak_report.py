"""The resource soak's figures (benchmarks/soak_resources.py): the CSV, the plot (when matplotlib is
importable: the `perf` extra), the summary and its verdict against the thresholds."""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.soak_load import Failure, Tally
from benchmarks.soak_repository import DEPENDS
from benchmarks.soak_sampler import Row

WINDOW = 3  # at least this many samples make a value: their median
GRACE_S = 5.0  # after a load returns, the gateways may take a moment to see the model ready


@dataclass
class Thresholds:
    rss_growth_pct: float = 5.0  # per process kind, after the warm-up
    # a kind's own bound where it differs (a short run's worker: see tests/integration/test_resource_soak.py)
    rss_growth_pct_of: dict[str, float] = field(default_factory=dict)
    fds: float = 2.0  # growth allowed per process kind (a connection open at one sample only)
    threads: float = 2.0
    shm_entries: float = 0.0
    nats_consumers: float = 2.0  # JetStream consumers (KV watches, key listings)
    nats_subscriptions: float = 10.0


@dataclass
class Reload:
    model: str
    began: float
    ended: float
    error: str = ""


def write_csv(rows: list[Row], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["t_s", "kind", "metric", "value"])
        writer.writerows(rows)


def series(rows: list[Row]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    found: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for at, kind, metric, value in rows:
        found[(kind, metric)].append((at, value))
    return found


def base_and_end(points: list[tuple[float, float]], warmup_s: float) -> tuple[float, float]:
    """The median of the first third of the samples after the warm-up, and of the last third (at
    least WINDOW each): a worker's RSS swings by 20 % from one sample to the next as onnxruntime
    sessions come and go with reloads, which a single sample at each end would take for growth."""
    after = [v for t, v in points if t >= warmup_s] or [points[-1][1]]
    window = max(WINDOW, len(after) // 3)
    return statistics.median(after[:window]), statistics.median(after[-window:])


def growth_pct(base: float, end: float) -> float:
    return round(100.0 * (end - base) / base, 2) if base else 0.0


def resources(rows: list[Row], warmup_s: float) -> dict[str, dict[str, Any]]:
    """Per kind and metric: [after warm-up, end], and the growth (in % for memory, else a delta)."""
    table: dict[str, dict[str, Any]] = defaultdict(dict)
    for (kind, metric), points in series(rows).items():
        base, end = base_and_end(points, warmup_s)
        grown = growth_pct(base, end) if metric.endswith("kib") else round(end - base, 1)
        table[kind][metric] = {"base": round(base, 1), "end": round(end, 1), "growth": grown}
    return dict(table)


def explained(failure: Failure, reloads: list[Reload]) -> bool:
    """A failure while a model it needs was being unloaded and loaded again (and GRACE_S after)."""
    needs = DEPENDS.get(failure.model, (failure.model,))
    return any(r.model in needs and failure.started <= r.ended + GRACE_S and failure.ended >= r.began for r in reloads)


def requests(tallies: list[Tally], reloads: list[Reload], began: float) -> dict[str, dict[str, Any]]:
    """Per kind of load: answers, failures in reload windows, the others (when, seconds into the run, and what)."""
    table = {}
    for tally in tallies:
        unexplained = [f for f in tally.failures if not explained(f, reloads)]
        errors: dict[str, int] = defaultdict(int)
        for failure in unexplained:
            errors[failure.error[:120]] += 1
        table[tally.kind] = {
            "model": tally.model,
            "ok": tally.ok,
            "failed_in_reloads": len(tally.failures) - len(unexplained),
            "failed_unexplained": len(unexplained),
            "errors": dict(errors),
            "unexplained_at_s": [round(f.started - began, 1) for f in unexplained[:20]],
        }
    return table


def violations(table: dict[str, dict[str, Any]], asked: dict[str, dict[str, Any]], limits: Thresholds) -> list[str]:
    """What crossed a threshold: memory, fds, threads, /dev/shm or NATS interest growing, failures unexplained."""
    found = _processes_grown(table, limits)
    for kind, metric, limit in (
        ("dev_shm", "server_entries", limits.shm_entries),
        # the load's own register/infer/unregister loop holds one region at a time, present at some samples only
        ("dev_shm", "client_entries", limits.shm_entries + 1),
        ("nats", "js_consumers", limits.nats_consumers),
        ("nats", "subscriptions", limits.nats_subscriptions),
    ):
        grown = table.get(kind, {}).get(metric, {}).get("growth", 0)
        if grown > limit:
            found.append(f"{kind} {metric} +{grown}")
    return found + [
        f"{kind}: {t['failed_unexplained']} unexplained failures"
        for kind, t in asked.items()
        if t["failed_unexplained"]
    ]


def _processes_grown(table: dict[str, dict[str, Any]], limits: Thresholds) -> list[str]:
    found = []
    for kind, metrics in table.items():
        if "rss_kib" in metrics and metrics["rss_kib"]["growth"] > limits.rss_growth_pct_of.get(
            kind, limits.rss_growth_pct
        ):
            found.append(f"{kind}: RSS +{metrics['rss_kib']['growth']} % after the warm-up")
        for metric, limit in (("fds", limits.fds), ("threads", limits.threads)):
            if metric in metrics and metrics[metric]["growth"] > limit:
                found.append(f"{kind}: {metric} +{metrics[metric]['growth']}")
    return found


def plot(rows: list[Row], path: Path) -> Path | None:
    """Memory, fds and threads per process kind, nats-server and /dev/shm over time; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    found = series(rows)
    panels = [("rss_kib", "RSS (MiB)", 1024), ("fds", "open fds", 1), ("threads", "threads", 1)]
    go = ("nats_go", "heap_alloc_kib") in found  # nats-server's Go heap, sampled: a panel of its own
    figure, axes = plt.subplots(3 if go else 2, 2, figsize=(13, 13 if go else 9), sharex=True)
    for axis, (metric, title, scale) in zip(axes.flat, panels):
        for (kind, name), points in sorted(found.items()):
            if name == metric:
                axis.plot([t / 60 for t, _ in points], [v / scale for _, v in points], label=kind)
        axis.set_title(title)
    _plot_bus(axes.flat[3], found)
    if go:
        _plot_go(axes.flat[4], found)
        axes.flat[5].set_visible(False)
    axes.flat[0].legend(fontsize="small")
    for axis in axes[-1]:
        axis.set_xlabel("minutes")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def _plot_bus(axis: Any, found: dict[tuple[str, str], list[tuple[float, float]]]) -> None:
    for key, label, scale in (
        (("nats", "varz_mem_kib"), "nats-server /varz mem (MiB)", 1024),
        (("nats", "js_storage"), "JetStream storage (KiB)", 1024),
        (("dev_shm", "server_entries"), "/dev/shm server entries", 1),
    ):
        points = found.get(key, [])
        if not points:
            continue
        axis.plot([t / 60 for t, _ in points], [v / scale for _, v in points], label=label)
    axis.set_title("bus and shared memory")
    axis.legend(fontsize="small")


def _plot_go(axis: Any, found: dict[tuple[str, str], list[tuple[float, float]]]) -> None:
    for (kind, metric), label in (
        (("nats-server", "rss_kib"), "RSS"),
        (("nats-server", "shared_kib"), "RSS, file pages (the binary)"),
        (("nats_go", "sys_kib"), "Sys (mapped by Go)"),
        (("nats_go", "heap_alloc_kib"), "HeapAlloc (live + garbage)"),
        (("nats_go", "next_gc_kib"), "NextGC (≈ 2 × live after a GC)"),
        (("nats_go", "heap_idle_kib"), "HeapIdle"),
        (("nats_go", "heap_released_kib"), "HeapReleased"),
    ):
        points = found.get((kind, metric), [])
        if points:
            axis.plot([t / 60 for t, _ in points], [v / 1024 for _, v in points], label=label)
    axis.set_title("nats-server: Go heap (MiB)")
    axis.legend(fontsize="small")


def text(summary: dict[str, Any]) -> str:
    """The summary as a few readable tables."""
    lines = [f"soak: {summary['minutes']} min, load average {summary['load_average']}, {summary['samples']} samples"]
    lines.append(f"{'kind':<22}{'RSS KiB base→end':>24}{'RSS %':>8}{'PSS %':>8}{'fds Δ':>7}{'threads Δ':>10}")
    for kind, m in summary["resources"].items():
        if "rss_kib" not in m:
            continue
        rss = f"{m['rss_kib']['base']:,.0f}→{m['rss_kib']['end']:,.0f}"
        lines.append(
            f"{kind:<22}{rss:>24}{m['rss_kib']['growth']:>8}{m['pss_kib']['growth']:>8}"
            f"{m['fds']['growth']:>7}{m['threads']['growth']:>10}"
        )
    for kind in ("dev_shm", "nats", "nats_go"):
        figures = summary["resources"].get(kind, {})
        if not figures:
            continue
        lines.append(f"{kind}: " + ", ".join(f"{k} {v['base']:g}→{v['end']:g}" for k, v in figures.items()))
    lines.append(f"{'requests':<32}{'ok':>9}{'failed in reloads':>19}{'unexplained':>13}")
    for kind, t in summary["requests"].items():
        lines.append(f"{kind:<32}{t['ok']:>9}{t['failed_in_reloads']:>19}{t['failed_unexplained']:>13}")
        lines += [f"    {count} × {error}" for error, count in t["errors"].items()]
        if t["unexplained_at_s"]:
            lines.append(f"    at {t['unexplained_at_s']} s")
    lines.append(f"reloads: {summary['reloads']} ({len(summary['reload_errors'])} failed)")
    for where, early, end in summary.get("nats_heap", {}).get("grown", []):
        lines.append(f"nats-server heap in use, grown: {early:,.0f} → {end:,.0f} KiB  {where}")
    lines.append("verdict: " + ("; ".join(summary["violations"]) or "flat"))
    return "\n".join(lines)

"""A run's results as perf_analyzer's CSV, a text table, and (with matplotlib) a throughput/latency plot."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

from shoal.perf.measure import LevelResult

# perf_analyzer 2.41 with --verbose-csv, in its order; Shoal's extra columns follow
SHOAL_COLUMNS = ["Server Inferences", "Server Executions", "Avg Batch Size", "Stable"]
PLOT_HINT = "plots need matplotlib: pip install 'shoal[perf]'"


def csv_header(results: Sequence[LevelResult]) -> list[str]:
    first = "Request Rate" if results and results[0].mode == "request_rate" else "Concurrency"
    percentiles = sorted(results[0].client.percentiles_us) if results else [50, 90, 95, 99]
    return [
        first,
        "Inferences/Second",
        "Client Send",
        "Network+Server Send/Recv",
        "Server Queue",
        "Server Compute Input",
        "Server Compute Infer",
        "Server Compute Output",
        "Client Recv",
        *[f"p{p} latency" for p in percentiles],
        "Avg latency",
        "request/response",
        "response wait",
        *SHOAL_COLUMNS,
    ]


def csv_row(r: LevelResult) -> list[object]:
    c, s = r.client, r.server
    server_us = s.queue_us + s.compute_input_us + s.compute_infer_us + s.compute_output_us
    network = max(0.0, c.avg_us - c.send_us - c.recv_us - server_us)
    level: object = int(r.level) if r.mode == "concurrency" else r.level
    return [
        level,
        round(c.throughput, 3),
        int(c.send_us),
        int(network),
        int(s.queue_us),
        int(s.compute_input_us),
        int(s.compute_infer_us),
        int(s.compute_output_us),
        int(c.recv_us),
        *[int(c.percentiles_us[p]) for p in sorted(c.percentiles_us)],
        int(c.avg_us),
        int(c.send_us + c.recv_us),
        int(c.avg_us - c.send_us - c.recv_us),
        s.inferences,
        s.executions,
        round(s.avg_batch_size, 2),
        int(r.stable),
    ]


def write_csv(results: Sequence[LevelResult], path: Path | str) -> None:
    """Rows in increasing throughput, as perf_analyzer writes them."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(csv_header(results))
        for r in sorted(results, key=lambda r: r.client.throughput):
            writer.writerow(csv_row(r))


def table(results: Sequence[LevelResult]) -> str:
    header = ["level", "infer/s", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "avg ms", "queue ms", "infer ms", "batch"]
    rows = [header]
    for r in results:
        c, s = r.client, r.server
        ms = [c.percentiles_us[p] / 1e3 for p in (50, 90, 95, 99)] + [c.avg_us / 1e3, s.queue_us / 1e3]
        level = f"{r.level:g}" + ("" if r.stable else "*")
        rows.append(
            [level, f"{c.throughput:.1f}", *(f"{v:.2f}" for v in ms), f"{s.compute_infer_us / 1e3:.2f}"]
            + [f"{s.avg_batch_size:.2f}"]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    out = io.StringIO()
    kind = "request rate" if results and results[0].mode == "request_rate" else "concurrency"
    out.write(f"level = {kind}; latencies are the client's; queue, infer and batch are the server's\n")
    for row in rows:
        out.write("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) + "\n")
    if any(not r.stable for r in results):
        out.write("* not stable within the trials: widen -s or lengthen -p\n")
    return out.getvalue()


def plot(results: Sequence[LevelResult], path: Path | str, title: str = "") -> bool:
    """Throughput against p99 latency across the levels; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    xs = [r.client.percentiles_us[99] / 1e3 for r in results]
    ys = [r.client.throughput for r in results]
    ax.plot(xs, ys, marker="o")
    for r, x, y in zip(results, xs, ys):
        ax.annotate(f"{r.level:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("p99 latency (ms)")
    ax.set_ylabel("throughput (infer/s)")
    ax.set_title(title or "throughput vs p99 latency")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True

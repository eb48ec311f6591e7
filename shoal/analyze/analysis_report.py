"""What `shoal analyze` leaves in --output: config.pbtxt (the best), results.csv (every point), report.html."""

from __future__ import annotations

import base64
import csv
import html
import io
from collections.abc import Sequence
from pathlib import Path

from shoal.analyze.configs import Candidate, to_pbtxt
from shoal.analyze.live_search import Analysis
from shoal.analyze.points import Point, best_point, pareto_front
from shoal.perf.output import PLOT_HINT, csv_header, csv_row

CONFIG_COLUMNS = ["Config", "Instances", "Max Batch Size", "Dynamic Batching", "Max Queue Delay (us)", "Preferred"]


def _config_cells(c: Candidate) -> list[object]:
    preferred = " ".join(map(str, c.preferred_batch_size))
    return [c.name, c.instances, c.max_batch_size, int(c.dynamic_batching), c.max_queue_delay_us, preferred]


def write_csv(points: list[Point], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CONFIG_COLUMNS + csv_header([p.result for p in points]))
        for p in points:
            writer.writerow(_config_cells(p.candidate) + csv_row(p.result))


def _plot_png(analysis: Analysis, budget_ms: float | None) -> bytes | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for candidate in analysis.configs:
        mine = [p for p in analysis.points if p.candidate == candidate]
        ax.plot([p.p99_ms for p in mine], [p.throughput for p in mine], marker="o", label=candidate.name, alpha=0.7)
    front = pareto_front(analysis.points)
    ax.plot([p.p99_ms for p in front], [p.throughput for p in front], "k--", lw=2, label="Pareto front")
    if budget_ms is not None:
        ax.axvline(budget_ms, color="red", ls=":", label=f"budget {budget_ms:g} ms")
    ax.set_xlabel("p99 latency (ms)")
    ax.set_ylabel("throughput (infer/s)")
    ax.set_title(f"{analysis.original.get('name', '')}: throughput vs p99 latency per configuration")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    return out.getvalue()


def _table(header: list[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _summary(analysis: Analysis, budget_ms: float | None) -> str:
    default = analysis.scores.get(analysis.default)
    best = analysis.best
    lines = [
        f"Search: {html.escape(analysis.stopped)}; {len(analysis.configs)} configurations, "
        f"{len(analysis.points)} points."
    ]
    lines.append(f"Latency budget (p99): {f'{budget_ms:g} ms' if budget_ms is not None else 'none'}.")
    if default is not None:
        lines.append(f"Original configuration {analysis.default.name}: {default:.1f} infer/s.")
    if best is not None:
        value = analysis.scores[best] or 0.0
        ratio = f" ({value / default:.2f}x the original)" if default else ""
        lines.append(f"Recommended {html.escape(best.name)}: {value:.1f} infer/s{ratio}.")
    else:
        lines.append("No configuration met the latency budget.")
    return "".join(f"<p>{line}</p>" for line in lines)


def write_html(analysis: Analysis, budget_ms: float | None, path: Path) -> None:
    rows = []
    for c, value in analysis.scores.items():
        top = best_point([p for p in analysis.points if p.candidate == c], budget_ms)
        at = [f"{top.result.level:g}", f"{top.p99_ms:.2f}"] if top else ["", ""]
        rows.append(_config_cells(c) + ["failed" if value is None else f"{value:.1f}", *at])
    header = CONFIG_COLUMNS + ["Score (infer/s)", "at concurrency", "p99 ms"]
    front = [
        [p.candidate.name, f"{p.result.level:g}", f"{p.throughput:.1f}", f"{p.p99_ms:.2f}"]
        for p in pareto_front(analysis.points)
    ]
    png = _plot_png(analysis, budget_ms)
    figure = (
        f'<img alt="throughput vs latency" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        if png
        else f"<p><em>{html.escape(PLOT_HINT)}</em></p>"
    )
    name = html.escape(str(analysis.original.get("name", "")))
    path.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>shoal analyze: {name}</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}</style></head><body>"
        f"<h1>shoal analyze: {name}</h1>{_summary(analysis, budget_ms)}{figure}"
        f"<h2>Configurations</h2>{_table(header, rows)}"
        f"<h2>Pareto front</h2>{_table(['Config', 'Concurrency', 'infer/s', 'p99 ms'], front)}"
        "<p>Every point is in results.csv; the recommended configuration is config.pbtxt.</p></body></html>"
    )


def write_outputs(analysis: Analysis, budget_ms: float | None, output: Path) -> list[Path]:
    output.mkdir(parents=True, exist_ok=True)
    written = [output / "results.csv", output / "report.html"]
    write_csv(analysis.points, written[0])
    write_html(analysis, budget_ms, written[1])
    if analysis.best is not None:
        (output / "config.pbtxt").write_text(to_pbtxt(analysis.configs[analysis.best]))
        written.insert(0, output / "config.pbtxt")
    return written

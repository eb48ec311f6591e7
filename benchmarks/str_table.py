"""The text-recognition tutorial's table, Triton against Shoal (issue 23 item 4; used by vs_triton.py).

The tutorial measures its STR model with
``perf_analyzer -b 2 --shape input.1:1,32,100 --concurrency-range 2:16:2`` in three configurations
(no batching, ``dynamic_batching {}``, two instances with dynamic batching) and shows throughput and
latency per concurrency. Here each configuration is swept on Triton (model.py + onnxruntime), on
Shoal with the same model.py, and on Shoal's native onnxruntime backend on its defaults, one after
the other, ``rounds`` times; each figure is the median over the rounds.
"""

from __future__ import annotations

import statistics
import subprocess
from collections.abc import Callable

STR_ARGS = ["-b", "2", "--shape", "input.1:1,32,100", "--concurrency-range", "2:16:2"]
CONCURRENCIES = range(2, 17, 2)
CONFIGS = {"": "no batching", "_dyn": "dynamic batching", "_dyn2": "dynamic batching, 2 instances"}
# (label, server, model prefix): Triton and Shoal run the same model.py; Shoal's native backend too
VARIANTS = [
    ("triton", "triton", "text_recognition_py"),
    ("shoal", "shoal", "text_recognition_py"),
    ("shoal native", "shoal", "text_recognition_onnx"),
]


def models(shoal: bool) -> list[str]:
    """Every STR model a server must have loaded before the sweep."""
    return [f"{prefix}{suffix}" for _, server, prefix in VARIANTS for suffix in CONFIGS if shoal or server == "triton"]


# one stable perf_analyzer measurement: (url, model, concurrency, extra args) -> figures or {"error"}
Once = Callable[[str, str, int, list[str]], dict]


def sweep(once: Once, url: str, model: str) -> list[dict]:
    """The tutorial's concurrencies, each measured on its own so that one level that does not settle
    on a loaded machine costs only its own row (a perf_analyzer sweep stops at the first such level)."""
    return [{"concurrency": conc, **once(url, model, conc, STR_ARGS[:4])} for conc in CONCURRENCIES]


def warm(pa: str, url: str, model: str) -> None:
    """A short run first: the first batches of an onnxruntime session are slower than the rest."""
    cmd = [pa, "-m", model, "-u", url, *STR_ARGS[:4], "--concurrency-range", "2:2", "-p", "500", "-r", "2", "-s", "90"]
    subprocess.run(cmd, capture_output=True, timeout=120)


def measure(pa: str, once: Once, urls: dict[str, str], rounds: int, log: Callable[..., None]) -> dict:
    """{config suffix: {variant label: [sweep per round]}}, the variants interleaved in each round."""
    result: dict[str, dict[str, list[list[dict]]]] = {}
    for _, server, prefix in VARIANTS:
        for suffix in CONFIGS:
            warm(pa, urls[server], f"{prefix}{suffix}")
    for suffix in CONFIGS:
        runs: dict[str, list[list[dict]]] = {label: [] for label, _, _ in VARIANTS}
        for _ in range(rounds):
            for label, server, prefix in VARIANTS:
                rows = sweep(once, urls[server], f"{prefix}{suffix}")
                runs[label].append(rows)
                log(f"str{suffix} {label}: {rows}")
        result[suffix] = runs
    return result


def _median_at(runs: list[list[dict]], conc: int, key: str) -> float | None:
    values = [row[key] for rows in runs for row in rows if row.get("concurrency") == conc and key in row]
    return statistics.median(values) if values else None


def render(result: dict, fmt: Callable[[float | None], str]) -> list[str]:
    """The tutorial's table per configuration, with Shoal ÷ Triton throughput per concurrency."""
    lines: list[str] = []
    for suffix, runs in result.items():
        lines += [
            "",
            f"Text recognition ({CONFIGS[suffix]}), perf_analyzer {' '.join(STR_ARGS)}:",
            "",
            "| concurrency | Triton infer/s · p95 µs | Shoal infer/s · p95 µs | Shoal native infer/s · p95 µs "
            "| Shoal ÷ Triton | native ÷ Triton |",
            "|---|---|---|---|---|---|",
        ]
        for conc in CONCURRENCIES:
            cells, thr = [], {}
            for label, _, _ in VARIANTS:
                thr[label] = _median_at(runs[label], conc, "throughput")
                cells.append(f"{fmt(thr[label])} · {fmt(_median_at(runs[label], conc, 'p95_us'))}")
            base = thr["triton"]
            ratios = [fmt(thr[v] / base) + "×" if base and thr[v] else "n/a" for v in ("shoal", "shoal native")]
            lines.append(f"| {conc} | {' | '.join(cells)} | {' | '.join(ratios)} |")
    return lines

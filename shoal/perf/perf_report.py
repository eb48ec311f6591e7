"""`shoal perf`'s run as the user sees it: a progress bar while it measures, then table, CSV and plot."""

from __future__ import annotations

import sys

from tqdm import tqdm

from shoal.perf.measure import ClientStats, LevelResult
from shoal.perf.options import PerfOptions
from shoal.perf.output import PLOT_HINT, plot, table, write_csv
from shoal.perf.run import measure, run_loop


def run_and_report(options: PerfOptions, csv_path: str | None, plot_path: str | None) -> int:
    kind = "rate" if options.mode == "request_rate" else "concurrency"
    levels = ", ".join(f"{level:g}" for level in options.levels)  # 1, 3, 5 rather than 1.0, 3.0, 5.0
    print(f"shoal perf: {options.model} at {options.url} ({options.protocol}), {kind} {levels}", file=sys.stderr)
    bar = tqdm(total=len(options.levels), unit="level", file=sys.stderr, dynamic_ncols=True)

    def on_window(level: float, trial: int, window: ClientStats) -> None:
        bar.set_postfix_str(f"{kind} {level:g} window {trial}: {window.throughput:.1f} infer/s")

    def on_level(result: LevelResult) -> None:
        bar.update(1)

    try:
        results = run_loop(measure(options, on_window, on_level))
    finally:
        bar.close()
    print(table(results))
    if csv_path:
        write_csv(results, csv_path)
        print(f"wrote {csv_path}")
    if plot_path:
        print(f"wrote {plot_path}" if plot(results, plot_path, options.model) else f"no plot: {PLOT_HINT}")
    return 0

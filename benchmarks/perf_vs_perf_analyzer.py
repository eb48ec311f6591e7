"""`shoal perf` against Triton's perf_analyzer on the same Shoal, pair after pair.

    python benchmarks/perf_vs_perf_analyzer.py                    # mlp, concurrency 4, 3 pairs
    python benchmarks/perf_vs_perf_analyzer.py --perf-analyzer /tmp/anchor-venv/bin/pa

For each protocol (HTTP, gRPC, gRPC streaming) the two tools run alternately against one cluster
(which goes first alternates too, so a machine that gets busier slows both alike), with the same
windows: `-p` ms, exactly 3 of them (`-s 1000`: a shared machine never "stabilises"). The ratio
is shoal perf / perf_analyzer throughput, read from each tool's CSV (`-f`), per pair.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CANDIDATES = [ROOT / "benchmarks" / ".tools" / "perf_analyzer", Path("/tmp/anchor-venv/bin/pa")]
PROTOCOLS = {"http": [], "grpc": ["-i", "grpc"], "grpc-stream": ["-i", "grpc", "--streaming"]}


def throughput(command: list[str], csv_path: Path) -> float:
    out = subprocess.run([*command, "-f", str(csv_path)], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{command[0]} failed:\n{(out.stdout + out.stderr)[-2000:]}")
    with open(csv_path) as f:
        return float(next(csv.DictReader(f))["Inferences/Second"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--perf-analyzer", default=next((str(p) for p in CANDIDATES if p.exists()), None))
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    args = parser.parse_args()
    if args.perf_analyzer is None:
        raise SystemExit("no perf_analyzer: run benchmarks/get_perf_analyzer.sh or pass --perf-analyzer")
    from services.repository.examples import write_examples
    from tests.cluster import running_cluster

    repository = write_examples(Path(tempfile.mkdtemp(prefix="shoal-perf-vs-pa-")))
    load = {"model_control_mode": "explicit", "load_model": [args.model]}
    common = ["-m", args.model, "--concurrency-range", str(args.concurrency), "-p", str(args.window_ms)]
    common += ["-s", "1000", "-r", "3"]
    work = Path(tempfile.mkdtemp(prefix="shoal-perf-vs-pa-csv-"))
    with running_cluster(repository, repository=load) as running:
        for protocol in args.protocols.split(","):
            url = running.url if protocol == "http" else running.grpc_url
            tools = {
                "perf_analyzer": [args.perf_analyzer, "-u", url, *PROTOCOLS[protocol], *common],
                "shoal perf": [sys.executable, "-m", "shoal.cli", "perf", "-u", url, *PROTOCOLS[protocol], *common],
            }
            ratios = []
            for pair in range(args.pairs):
                order = list(tools) if pair % 2 == 0 else list(reversed(tools))
                got = {
                    name: throughput(tools[name], work / f"{protocol}-{pair}-{i}.csv") for i, name in enumerate(order)
                }
                ratios.append(got["shoal perf"] / got["perf_analyzer"])
                print(
                    f"{protocol:12s} pair {pair + 1}: perf_analyzer {got['perf_analyzer']:8.1f} infer/s, "
                    f"shoal perf {got['shoal perf']:8.1f} infer/s, ratio {ratios[-1]:.2f}",
                    flush=True,
                )
            print(
                f"{protocol:12s} ratios {', '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median(ratios):.2f}"
            )


if __name__ == "__main__":
    main()

"""Shoal's gRPC endpoint against its HTTP endpoint, measured in one run with perf_analyzer.

    python benchmarks/grpc_vs_http.py            # starts Shoal itself on free ports
    python benchmarks/grpc_vs_http.py --rounds 3 # repeat each point, keep the median

For each model and concurrency the three protocols (HTTP binary tensors, gRPC unary,
gRPC streaming) run back to back against the same server, round after round, so a
busy machine slows them alike; the ratio is gRPC / HTTP throughput. Beside each: NATS
messages per request (nats-server `/varz` `in_msgs`), requests per model execution (the
batch size the scheduler formed) and the gateway process's CPU per request (/proc), from
counters read around each run.
`--compare-grpcio` also starts a second Shoal with grpcio's server (`--grpc-server=grpcio`)
and measures its gRPC in the same rotation. Needs
Triton's perf_analyzer 2.41.0: `benchmarks/get_perf_analyzer.sh`, or the anchor environment's
`/tmp/anchor-venv/bin/pa` (made by the setup step of `benchmarks/vs_triton.py`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# benchmarks/get_perf_analyzer.sh's copy, else the anchor environment's wrapper (benchmarks/vs_triton.py sets it up)
CANDIDATES = (ROOT / "benchmarks" / ".tools" / "perf_analyzer", Path("/tmp/anchor-venv/bin/pa"))
PERF_ANALYZER = next((p for p in CANDIDATES if p.exists()), CANDIDATES[0])
PROTOCOLS = {"http": "", "grpc": "-i grpc", "grpc-stream": "-i grpc --streaming"}


def counters(running: object, model: str) -> tuple[float, float, float, float]:
    """(NATS messages in, successful requests, executions) of `model` so far, and the gateway's CPU seconds."""
    import urllib.request

    gateway = running.cluster.child("gateway").process  # type: ignore[attr-defined]
    fields = Path(f"/proc/{gateway.pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    nats = running.nats  # type: ignore[attr-defined]
    with urllib.request.urlopen(f"http://127.0.0.1:{nats.monitor_port}/varz", timeout=10) as response:
        in_msgs = float(json.loads(response.read())["in_msgs"])
    requests = executions = 0.0
    with urllib.request.urlopen(running.metrics_url, timeout=10) as response:  # type: ignore[attr-defined]
        for line in response.read().decode().splitlines():
            if f'model="{model}"' not in line:
                continue
            if line.startswith("nv_inference_request_success"):
                requests += float(line.rsplit(" ", 1)[1])
            elif line.startswith("nv_inference_exec_count"):
                executions += float(line.rsplit(" ", 1)[1])
    return in_msgs, requests, executions, cpu


def measure(running: object, url: str, protocol: str, model: str, concurrency: int, seconds: float) -> dict[str, float]:
    before = counters(running, model)
    result = _perf_analyzer(url, protocol, model, concurrency, seconds)
    after = counters(running, model)
    requests = max(after[1] - before[1], 1.0)
    result["msgs_per_request"] = (after[0] - before[0]) / requests
    result["batch"] = requests / max(after[2] - before[2], 1.0)
    result["gateway_us"] = (after[3] - before[3]) / requests * 1e6
    return result


def _perf_analyzer(url: str, protocol: str, model: str, concurrency: int, seconds: float) -> dict[str, float]:
    command = [str(PERF_ANALYZER), "-m", model, "-u", url, *PROTOCOLS[protocol].split()]
    command += ["--shape", "INPUT0:16"] if model.startswith("identity") else []  # its input is [-1]
    command += ["--concurrency-range", str(concurrency), "--measurement-interval", str(int(seconds * 1000))]
    command += ["--max-trials", "3", "--stability-percentage", "1000"]  # a shared machine never settles
    out = subprocess.run(command, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed:\n{text[-2000:]}")

    def grab(pattern: str) -> float:
        found = re.search(pattern, text)
        return float(found.group(1)) if found else float("nan")

    return {"throughput": grab(r"Throughput: ([\d.]+) infer/sec"), "p50_us": grab(r"p50 latency: (\d+) usec")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="simple,mlp")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement window per point")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--compare-grpcio", action="store_true", help="also a Shoal on grpcio's server")
    args = parser.parse_args()
    if not PERF_ANALYZER.exists():
        raise SystemExit("run benchmarks/get_perf_analyzer.sh first")
    from services.repository.examples import write_examples
    from tests.cluster import running_cluster

    repository = write_examples(Path(tempfile.mkdtemp(prefix="shoal-grpc-bench-")))
    rows = []
    print(f"load average before: {os.getloadavg()}", flush=True)
    with contextlib.ExitStack() as stack:
        running = stack.enter_context(running_cluster(repository))
        points = {p: (running, running.grpc_url if "grpc" in p else running.url, p) for p in PROTOCOLS}
        if args.compare_grpcio:
            fallback = stack.enter_context(running_cluster(repository, grpc_server="grpcio"))
            points["grpcio"] = (fallback, fallback.grpc_url, "grpc")
            points["grpcio-stream"] = (fallback, fallback.grpc_url, "grpc-stream")
        for model in args.models.split(","):
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                runs: dict[str, list[dict]] = {p: [] for p in points}
                for _ in range(args.rounds):
                    for name, (server, url, protocol) in points.items():
                        runs[name].append(measure(server, url, protocol, model, concurrency, args.seconds))
                best = {p: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for p, rs in runs.items()}
                rows.append({"model": model, "concurrency": concurrency, **best})
                http = best["http"]["throughput"]
                print(
                    f"{model:7s} c={concurrency:<3d}"
                    + "".join(
                        f" | {p} {best[p]['throughput']:7.0f}/s p50 {best[p]['p50_us']:6.0f}us"
                        + ("" if p == "http" else f" ({best[p]['throughput'] / http:.2f}x)")
                        + f" {best[p]['msgs_per_request']:.2f} msg/req batch {best[p]['batch']:.1f}"
                        + f" gateway {best[p]['gateway_us']:.0f}us/req"
                        for p in points
                    ),
                    flush=True,
                )
    print(f"load average after: {os.getloadavg()}")
    out_dir = ROOT / "bench-out"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"grpc-vs-http-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(rows, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

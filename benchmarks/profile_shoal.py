#!/usr/bin/env python3
"""Where Shoal's CPU per request goes: py-spy on every service under perf_analyzer load.

usage: python benchmarks/profile_shoal.py MODEL_REPO --out DIR [--model mlp_onnx] [--concurrency 16]
                                          [--seconds 15] [--shoal-cmd shoal] [--pa /tmp/anchor-venv/bin/pa]
       python benchmarks/profile_shoal.py --summarize DIR/*.txt

Starts `shoal serve` on MODEL_REPO (free ports), puts MODEL under a perf_analyzer load at the
given concurrency, and meanwhile records each Shoal process (gateway, scheduler, worker, python
model child worker) with `py-spy record --format raw` (collapsed stacks, idle excluded, GIL-free
native threads excluded) for SECONDS. Also reads nats-server's /varz before/after to give NATS
messages per request, and per-process CPU µs per request (from /proc) over the same window.
Prints, per process, the top self-time and cumulative-time functions (file:function, % of samples).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_triton import Shoal, cpu_s, label, served, tree  # noqa: E402

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def short(frame: str) -> str:
    m = FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    f = m["file"]
    for marker in ("site-packages/", "lib/python3.11/", "wt-perf/", "main/"):
        if marker in f:
            f = f.split(marker, 1)[1]
            break
    return f"{f}:{m['func']}"


def summarize(path: Path, top: int = 15) -> str:
    self_t: collections.Counter = collections.Counter()
    cum: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        n = int(n)
        frames = [short(f) for f in stack.split(";") if f]
        if not frames:
            continue
        total += n
        self_t[frames[-1]] += n
        for f in set(frames):
            cum[f] += n
    out = [f"## {path.stem}: {total} samples", "", "self:"]
    out += [f"  {c / total * 100:5.1f}%  {f}" for f, c in self_t.most_common(top)]
    out += ["", "cumulative:"]
    out += [f"  {c / total * 100:5.1f}%  {f}" for f, c in cum.most_common(top + 10)]
    return "\n".join(out)


def executions(http: str, model: str) -> int:
    with urllib.request.urlopen(f"http://{http}/v2/models/{model}/stats", timeout=10) as r:
        return sum(m["execution_count"] for m in json.load(r)["model_stats"])


def varz(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=5) as r:
        return json.load(r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("repo", nargs="?")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--model", action="append", default=None)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--shoal-cmd", default="shoal")
    ap.add_argument("--pa", default="/tmp/anchor-venv/bin/pa")
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument(
        "--gil",
        action="store_true",
        help="sample only the thread holding the GIL (Python CPU time; without it py-spy's idle "
        "detection counts time in uvloop's C code and blocked executor threads as active)",
    )
    ap.add_argument("--no-pyspy", action="store_true", help="only CPU and message counts")
    ap.add_argument("--summarize", nargs="*")
    args = ap.parse_args()
    if args.summarize:
        for p in args.summarize:
            print(summarize(Path(p)), "\n")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    models = args.model or ["mlp_onnx", "simple"]
    shoal = Shoal(shlex.split(args.shoal_cmd), Path(args.repo), args.out / "shoal.log", None)
    report: dict = {}
    try:
        shoal.start(models)
        url = f"127.0.0.1:{shoal.http}"
        for model in models:
            extra = ["--shape", "INPUT0:16"] if model.startswith("identity") else []
            pa_cmd = [
                args.pa,
                "-m",
                model,
                "-u",
                url,
                "--concurrency-range",
                f"{args.concurrency}:{args.concurrency}",
                "-p",
                str((args.seconds + 8) * 1000),
                "-r",
                "1",
                "-s",
                "100",
                *extra,
            ]
            load = subprocess.Popen(pa_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(4)  # past warm-up
            pids = {p: label(p) for p in tree(shoal.proc.pid)}
            procs = {
                f"{model}-{name.split()[0] if name != 'worker (python model child)' else 'pychild'}-{p}": p
                for p, name in pids.items()
                if name in ("gateway", "scheduler", "worker", "worker (python model child)")
            }
            v0, n0, e0 = varz(shoal.monitor), served(url, model), executions(url, model)
            c0 = {p: cpu_s(p) for p in pids}
            spies = []
            if not args.no_pyspy:
                for name, pid in procs.items():
                    spies.append(
                        subprocess.Popen(
                            [
                                "py-spy",
                                "record",
                                "--pid",
                                str(pid),
                                "--format",
                                "raw",
                                *(["--gil"] if args.gil else []),
                                "-r",
                                str(args.rate),
                                "-d",
                                str(args.seconds),
                                "-o",
                                str(args.out / f"{name}.txt"),
                                "--nonblocking",
                            ],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        )
                    )
                for s in spies:
                    s.wait()
            else:
                time.sleep(args.seconds)
            v1, n1, e1 = varz(shoal.monitor), served(url, model), executions(url, model)
            c1 = {p: cpu_s(p) for p in pids}
            load.wait()
            n = max(1, n1 - n0)
            cpu: dict[str, float] = {}
            for p, name in pids.items():
                if name:
                    cpu[name] = cpu.get(name, 0.0) + (c1[p] - c0[p]) / n * 1e6
            report[model] = {
                "requests": n,
                "throughput": round(n / args.seconds),
                "mean_batch": round(n / max(1, e1 - e0), 2),
                "note": "CPU includes py-spy's sampling overhead" if spies else "",
                "nats_in_msgs_per_request": round((v1["in_msgs"] - v0["in_msgs"]) / n, 2),
                "nats_out_msgs_per_request": round((v1["out_msgs"] - v0["out_msgs"]) / n, 2),
                "nats_in_bytes_per_request": round((v1["in_bytes"] - v0["in_bytes"]) / n),
                "cpu_us_per_request": {k: round(v) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])},
            }
            print(json.dumps({model: report[model]}, indent=1), flush=True)
            for name in procs:
                f = args.out / f"{name}.txt"
                if f.exists():
                    text = summarize(f)
                    (args.out / f"{name}.summary.txt").write_text(text)
                    print(text, "\n", flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        left = shoal.stop()
        if left:
            print("WARNING: left behind:", left, file=sys.stderr)
    (args.out / "profile.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

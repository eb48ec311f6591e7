#!/usr/bin/env python3
"""NATS messages and server CPU per request, with the scheduler co-hosted in the gateway or standalone.

usage: python benchmarks/bus_messages.py [--requests 2000] [--shapes cohost,cohost-nats,standalone]
                                         [--out benchmarks/results/cohost] [--shoal-cmd shoal]

For each shape, starts `shoal serve` on the example repository (free ports, the embedded
nats-server with monitoring) with `--cohost-scheduler true` or `false`, then for each case sends a
known number of requests with the official tritonclient over HTTP (threads, one client each) and
reads around them:
  - nats-server's /varz: in_msgs and out_msgs per request (a message published is one in, each
    subscriber it reaches one out);
  - /proc CPU time (user + system) of every process of the `shoal serve` tree, µs per request;
  - /proc system calls of each process (`syscr`, `syscw` in /proc/PID/io: read and write
    calls of every kind, sockets, eventfds and pipes alike), per request: unlike `strace -c` it
    does not slow the process it counts.
Cases: `simple` (a python model) at concurrency 1 and 16, `identity_fp32` (native onnxruntime,
dynamic batching) at 16, and `mlp` (native onnxruntime, dynamic batching, two instances) at 16.
The CPU figures move with the machine's load (printed beside them); the message counts do not.
`--calls`: instead, Python function calls per request per process, a count the load does not move
(cProfile through `SHOAL_PROFILE_DIR`, shared/process/runtime.py): each shape is served twice, with N and 2N
requests of `simple` at c=1 after the same warm-up, and the difference between the two profiles of
each process is divided by N (start-up and shutdown cancel out).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pstats
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_triton import Shoal, cpu_s, http_json, label, served, tree  # noqa: E402

CASES = {  # name -> (model, concurrency)
    "simple_c1": ("simple", 1),
    "simple_c16": ("simple", 16),
    "identity_c16": ("identity_fp32", 16),
    "mlp_c16": ("mlp", 16),
}


def inputs(model: str) -> list[httpclient.InferInput]:
    if model == "simple":
        made = []
        for name in ("INPUT0", "INPUT1"):
            tensor = httpclient.InferInput(name, [1, 16], "INT32")
            tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
            made.append(tensor)
        return made
    width = 256 if model == "mlp" else 16
    tensor = httpclient.InferInput("INPUT0", [1, width], "FP32")
    tensor.set_data_from_numpy(np.ones((1, width), np.float32))
    return [tensor]


def drive(url: str, model: str, concurrency: int, total: int) -> None:
    """`total` requests from `concurrency` threads, each with its own client."""
    per = total // concurrency

    def one() -> None:
        client = httpclient.InferenceServerClient(url, network_timeout=60)
        made = inputs(model)
        for _ in range(per):
            client.infer(model, made)
        client.close()

    threads = [threading.Thread(target=one) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def measure(shoal: Shoal, model: str, concurrency: int, total: int) -> dict:
    url = f"127.0.0.1:{shoal.http}"
    drive(url, model, concurrency, min(total, 200))  # warm up
    pids = tree(shoal.proc.pid)  # type: ignore[union-attr]
    names = {p: label(p) or "?" for p in pids}
    v0 = http_json(f"http://127.0.0.1:{shoal.monitor}/varz")
    n0 = served(url, model)
    c0 = {p: cpu_s(p) for p in pids}
    s0 = {p: syscalls(p) for p in pids}
    started = time.monotonic()
    drive(url, model, concurrency, total)
    elapsed = time.monotonic() - started
    c1 = {p: cpu_s(p) for p in pids}
    s1 = {p: syscalls(p) for p in pids}
    v1 = http_json(f"http://127.0.0.1:{shoal.monitor}/varz")
    n = served(url, model) - n0
    cpu: dict[str, float] = {}
    calls: dict[str, list[int]] = {}
    for p in pids:
        cpu[names[p]] = cpu.get(names[p], 0.0) + (c1[p] - c0[p])
        counted = calls.setdefault(names[p], [0, 0])
        counted[0] += s1[p][0] - s0[p][0]
        counted[1] += s1[p][1] - s0[p][1]
    return {
        "requests": n,
        "in_msgs_per_request": round((v1["in_msgs"] - v0["in_msgs"]) / n, 2),
        "out_msgs_per_request": round((v1["out_msgs"] - v0["out_msgs"]) / n, 2),
        "cpu_us_per_request": {k: round(v * 1e6 / n) for k, v in sorted(cpu.items()) if v > 0},
        "cpu_us_per_request_total": round(sum(cpu.values()) * 1e6 / n),
        "syscalls_per_request": {  # [reads, writes]
            k: [round(r / n, 2), round(w / n, 2)] for k, (r, w) in sorted(calls.items()) if r or w
        },
        "requests_per_s": round(n / elapsed),
        "load_average": os.getloadavg()[0],
    }


def serve_flags(shape: str) -> list[str]:
    """cohost: the scheduler in the gateway, batches over the local channel (docs/design.md §9);
    cohost-nats: the same over NATS; standalone: a scheduler process of its own."""
    return {
        "cohost": ["--cohost-scheduler", "true", "--local-channel", "true"],
        "cohost-nats": ["--cohost-scheduler", "true", "--local-channel", "false"],
        "standalone": ["--cohost-scheduler", "false"],
    }[shape]


def syscalls(pid: int) -> tuple[int, int]:
    """The process's read and write system calls so far (all of its threads)."""
    try:
        fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    except (OSError, ValueError):
        return 0, 0
    return int(fields["syscr"]), int(fields["syscw"])


def profiled_calls(cmd: list[str], repo: Path, log: Path, shape: str, requests: int) -> dict[str, int]:
    """Function calls per service over a whole `shoal serve` run that served `requests` (+ warm-up)."""
    with tempfile.TemporaryDirectory() as folder:
        os.environ["SHOAL_PROFILE_DIR"] = folder
        try:
            shoal = Shoal(cmd, repo, log, None)
            shoal.cmd += serve_flags(shape)
            shoal.start(["simple"])
            try:
                url = f"127.0.0.1:{shoal.http}"
                drive(url, "simple", 1, 200)
                drive(url, "simple", 1, requests)
            finally:
                shoal.stop()
        finally:
            del os.environ["SHOAL_PROFILE_DIR"]
        calls: dict[str, int] = {}
        for path in glob.glob(f"{folder}/*.prof"):
            service = os.path.basename(path).rsplit("-", 1)[0]
            calls[service] = calls.get(service, 0) + pstats.Stats(path).total_calls  # type: ignore[attr-defined]
        return calls


def calls_per_request(args: argparse.Namespace, repo: Path, out: Path) -> None:
    n = args.requests
    results = {}
    for shape in args.shapes.split(","):
        cmd = shlex.split(args.shoal_cmd)
        one = profiled_calls(cmd, repo, out / f"calls-{shape}-1.log", shape, n)
        two = profiled_calls(cmd, repo, out / f"calls-{shape}-2.log", shape, 2 * n)
        results[shape] = {k: round((two.get(k, 0) - one.get(k, 0)) / n) for k in sorted(set(one) | set(two))}
        print(shape, json.dumps(results[shape]), flush=True)
    (out / "calls_per_request.json").write_text(json.dumps(results, indent=2))
    print("\n| shape | Python calls per request (`simple`, c=1) | total |\n|---|---|---|")
    for shape, per in results.items():
        print(f"| {shape} | {', '.join(f'{k} {v}' for k, v in per.items())} | {sum(per.values())} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--shapes", default="cohost,cohost-nats,standalone")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out", default="benchmarks/results/cohost")
    parser.add_argument("--shoal-cmd", default="shoal")
    parser.add_argument("--calls", action="store_true", help="Python calls per request per process instead")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from services.repository.examples import write_examples

    with tempfile.TemporaryDirectory() as models:  # the results folder keeps only results
        repo = write_examples(Path(models))
        if args.calls:
            calls_per_request(args, repo, out)
        else:
            messages_per_request(args, repo, out)


def messages_per_request(args: argparse.Namespace, repo: Path, out: Path) -> None:
    results: dict[str, dict] = {}
    for shape in args.shapes.split(","):
        shoal = Shoal(shlex.split(args.shoal_cmd), repo, out / f"serve-{shape}.log", None)
        shoal.cmd += serve_flags(shape)
        shoal.start(sorted({CASES[case][0] for case in args.cases.split(",")}))
        try:
            for case in args.cases.split(","):
                model, concurrency = CASES[case]
                results.setdefault(case, {})[shape] = measure(shoal, model, concurrency, args.requests)
                print(case, shape, json.dumps(results[case][shape]), flush=True)
        finally:
            shoal.stop()
    (out / "bus_messages.json").write_text(json.dumps(results, indent=2))
    print("\n| case | shape | NATS in msgs/req | out msgs/req | CPU µs/req (total) | per process | load |")
    print("|---|---|---|---|---|---|---|")
    for case, shapes in results.items():
        for shape, r in shapes.items():
            per = ", ".join(f"{k} {v}" for k, v in r["cpu_us_per_request"].items())
            print(
                f"| {case} | {shape} | {r['in_msgs_per_request']} | {r['out_msgs_per_request']} | "
                f"{r['cpu_us_per_request_total']} | {per} | {r['load_average']:.1f} |"
            )
    print("\n| case | shape | system calls per request, reads / writes, per process |\n|---|---|---|")
    for case, shapes in results.items():
        for shape, r in shapes.items():
            per = ", ".join(f"{k} {rw[0]} / {rw[1]}" for k, rw in r["syscalls_per_request"].items())
            print(f"| {case} | {shape} | {per} |")


if __name__ == "__main__":
    main()

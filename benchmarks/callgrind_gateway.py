#!/usr/bin/env python3
"""Instructions per request of one gateway process, counted by callgrind: an A/B of source trees
that the machine's load does not blur (docs/performance.md, "Compiled code").

usage: python benchmarks/callgrind_gateway.py REPO MODEL TREE [TREE ...] [--requests 2000]
           [--concurrency 8] [--rounds 1] [--out DIR] [--sole]

One nats-server and one `shoal serve --nats-url` (this checkout's code) serve REPO. For each TREE in
turn, a second gateway runs from that tree (`env -C TREE PYTHONPATH=TREE python -m shoal.cli gateway`)
under `valgrind --tool=callgrind`; after a warm-up its counters are zeroed (`callgrind_control -z`),
`--requests` HTTP inference requests go to it from `--concurrency` keep-alive connections, and the
counters are dumped. With `--sole`, no `shoal serve` gateway runs beside it (`shoal repository` and
`shoal worker` only), so the measured gateway's co-hosted scheduler holds every model's lease and its
queues, batching and completions are counted too (docs/design.md, "Co-hosting"). Prints instructions per request (all of the process's threads: Python, uvloop,
httptools, msgspec, the kernel entry code is not counted). Needs `valgrind` (apt-get install valgrind).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from shared.natsserver import NatsServer, free_port

ITEM_SIZE = {"BOOL": 1, "INT8": 1, "UINT8": 1, "INT16": 2, "UINT16": 2, "FP16": 2, "BF16": 2, "INT32": 4}
ITEM_SIZE |= {"UINT32": 4, "FP32": 4, "INT64": 8, "UINT64": 8, "FP64": 8}


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {timeout} s")
        time.sleep(0.2)


def ready(port: int, model: str) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", f"/v2/models/{model}/ready")
        return conn.getresponse().status == 200
    except OSError:
        return False


def request_body(port: int, model: str) -> tuple[bytes, dict[str, str]]:
    """What perf_analyzer sends: every input at batch 1 (variable dimensions at 16) in the binary
    tensor extension, every output asked for as binary."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", f"/v2/models/{model}")
    meta = json.loads(conn.getresponse().read())
    conn.request("GET", f"/v2/models/{model}/config")
    batching = json.loads(conn.getresponse().read()).get("max_batch_size", 0) > 0
    inputs, raw = [], b""
    for spec in meta["inputs"]:
        shape = [16 if d == -1 else d for d in spec["shape"]]
        if batching:
            shape[0] = 1
        count = 1
        for d in shape:
            count *= d
        data = bytes(count * ITEM_SIZE[spec["datatype"]])
        inputs.append(
            {
                "name": spec["name"],
                "shape": shape,
                "datatype": spec["datatype"],
                "parameters": {"binary_data_size": len(data)},
            }
        )
        raw += data
    outputs = [{"name": o["name"], "parameters": {"binary_data": True}} for o in meta["outputs"]]
    header = json.dumps({"inputs": inputs, "outputs": outputs}).encode()
    return header + raw, {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }


def load(port: int, model: str, request: tuple[bytes, dict[str, str]], total: int, concurrency: int) -> None:
    """`total` requests over `concurrency` keep-alive connections; every answer must be 200."""
    failures: list[str] = []

    def one_connection(n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        for _ in range(n):
            conn.request("POST", f"/v2/models/{model}/infer", *request)
            response = conn.getresponse()
            data = response.read()
            if response.status != 200:
                failures.append(f"{response.status} {data[:200]!r}")
                return

    threads = [threading.Thread(target=one_connection, args=(total // concurrency,)) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit(f"requests failed: {failures[:3]}")


def instructions(dump_dir: Path, pid: int) -> int:
    """The total of callgrind's last dump of `pid` (its `summary:`/`totals:` line)."""
    dumps = sorted(dump_dir.glob(f"callgrind.out.{pid}*"), key=lambda p: p.stat().st_mtime)
    text = dumps[-1].read_text(errors="replace")
    match = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
    if match is None:
        raise SystemExit(f"no totals in {dumps[-1]}")
    return int(match.group(1))


def measure(tree: Path, nats_url: str, model: str, args: argparse.Namespace, out: Path) -> float:
    port = free_port()
    cmd = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}/callgrind.out.%p",
        sys.executable,
        "-m",
        "shoal.cli",
        "gateway",
        "--nats-url",
        nats_url,
        "--http-port",
        str(port),
        "--allow-grpc",
        "false",
        "--allow-metrics",
        "false",
    ]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    log = open(out / f"gateway-{tree.name}.log", "ab")
    gateway = subprocess.Popen(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: ready(port, model), 600, f"gateway from {tree} under callgrind")
        body = request_body(port, model)
        load(port, model, body, args.warmup, args.concurrency)
        subprocess.run(["callgrind_control", "-z", str(gateway.pid)], check=True, capture_output=True)
        load(port, model, body, args.requests, args.concurrency)
        subprocess.run(["callgrind_control", "-d", str(gateway.pid)], check=True, capture_output=True)
        wait_until(lambda: any(out.glob(f"callgrind.out.{gateway.pid}.*")), 60, "callgrind dump")
        return instructions(out, gateway.pid) / (args.requests // args.concurrency * args.concurrency)
    finally:
        gateway.send_signal(signal.SIGINT)
        try:
            gateway.wait(120)
        except subprocess.TimeoutExpired:
            gateway.kill()
            gateway.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("repo", type=Path)
    ap.add_argument("model")
    ap.add_argument("trees", type=Path, nargs="+")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--sole", action="store_true", help="the measured gateway is the only one (its scheduler counted)")
    args = ap.parse_args()
    out = (args.out or Path(tempfile.mkdtemp(prefix="callgrind-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    nats = NatsServer().start()
    serve_port = free_port()
    serve_cmd = f"{shlex.quote(sys.executable)} -m shoal.cli serve --nats-url {nats.url} --model-repository {args.repo}"
    serve_cmd += f" --http-port {serve_port} --grpc-port {free_port()} --metrics-port {free_port()}"
    commands = [shlex.split(serve_cmd)]
    if args.sole:  # the repository and a worker, no gateway (`shoal serve` runs these two the same way)
        base = [sys.executable, "-m", "shoal.cli"]
        repository = [*base, "repository", "--nats-url", nats.url, "--model-repository", str(args.repo)]
        commands = [repository, [*base, "worker", "--nats-url", nats.url]]
    log = open(out / "serve.log", "ab")
    services = [subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True) for cmd in commands]
    try:
        if not args.sole:
            wait_until(lambda: ready(serve_port, args.model), 120, "shoal serve")
        for round_ in range(1, args.rounds + 1):
            for tree in args.trees:
                per_request = measure(tree.resolve(), nats.url, args.model, args, out)
                print(f"round {round_} {tree} {args.model}: {per_request:,.0f} instructions per request", flush=True)
    finally:
        for service in services:
            service.send_signal(signal.SIGINT)
        for service in services:
            try:
                service.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(service.pid, signal.SIGKILL)
                service.wait()
        nats.stop()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Instructions per request of one gateway process, counted by callgrind: an A/B of source trees
that the machine's load does not blur (docs/performance.md, "Compiled code").

usage: python benchmarks/callgrind_gateway.py REPO MODEL TREE [TREE ...] [--requests 2000]
           [--concurrency 8] [--rounds 1] [--out DIR] [--grpc | --grpc-stream] [--sole]

One nats-server and one `shoal serve --nats-url` (this checkout's code) serve REPO. For each TREE in
turn, a second gateway runs from that tree (`env -C TREE PYTHONPATH=TREE python -m shoal.cli
gateway`) under `valgrind --tool=callgrind`; after a warm-up its counters are zeroed
(`callgrind_control -z`), `--requests` HTTP inference requests go to it from `--concurrency`
keep-alive connections, and the counters are dumped (`--grpc`: the same requests as gRPC ModelInfer
calls, as perf_analyzer -i grpc sends them, from `--concurrency` threads over one channel per six,
as its client shares them; `--grpc-stream`: as ModelStreamInfer requests, one stream per thread).
With `--sole`, no `shoal serve` gateway runs beside it (`shoal repository` and `shoal worker` only),
so the measured gateway's co-hosted scheduler holds every model's lease and its queues, batching and
completions are counted too (docs/design.md, "Co-hosting"). Prints instructions per request (all of
the process's threads: Python, uvloop, httptools, msgspec, the kernel entry code is not counted).
Needs `valgrind` (apt-get install valgrind).
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
from typing import Any

from shared.process.natsserver import NatsServer, free_port

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


def grpc_request(http_request: tuple[bytes, dict[str, str]], model: str) -> Any:
    """The HTTP request's inputs and outputs as a ModelInferRequest with raw contents."""
    from tritonclient.grpc import service_pb2 as pb

    body, headers = http_request
    split = int(headers["Inference-Header-Content-Length"])
    header, raw = json.loads(body[:split]), body[split:]
    request = pb.ModelInferRequest(model_name=model)
    for spec in header["inputs"]:
        request.inputs.add(name=spec["name"], datatype=spec["datatype"], shape=spec["shape"])
        size = spec["parameters"]["binary_data_size"]
        request.raw_input_contents.append(raw[:size])
        raw = raw[size:]
    for out in header["outputs"]:
        request.outputs.add(name=out["name"])
    return request


def load_grpc(port: int, request: Any, total: int, concurrency: int, streaming: bool) -> None:
    """`total` gRPC calls (or streamed requests) from `concurrency` threads; every one must succeed."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for _ in range((concurrency + 5) // 6)]
    failures: list[str] = []

    def unary(stub: Any, n: int) -> None:
        for _ in range(n):
            stub.ModelInfer(request, timeout=300)

    def stream(stub: Any, n: int) -> None:
        for answer in stub.ModelStreamInfer(iter([request] * n), timeout=300):
            if answer.error_message:
                failures.append(answer.error_message)

    def one(index: int) -> None:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channels[index // 6])
        try:
            (stream if streaming else unary)(stub, total // concurrency)
        except grpc.RpcError as exc:
            failures.append(str(exc))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for channel in channels:
        channel.close()
    if failures:
        raise SystemExit(f"gRPC requests failed: {failures[:3]}")


def instructions(dump_dir: Path, pid: int) -> int:
    """The total of the last dump `callgrind_control -d` made of `pid` (its `summary:`/`totals:`
    line), not the one at the process's exit."""
    dumps = sorted(dump_dir.glob(f"callgrind.out.{pid}.*"), key=lambda p: p.stat().st_mtime)
    text = dumps[-1].read_text(errors="replace")
    match = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
    if match is None:
        raise SystemExit(f"no totals in {dumps[-1]}")
    return int(match.group(1))


def measure(tree: Path, nats_url: str, model: str, args: argparse.Namespace, out: Path) -> float:
    port, grpc_port = free_port(), free_port()
    grpc = args.grpc or args.grpc_stream
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
        "true" if grpc else "false",
        "--grpc-port",
        str(grpc_port),
        "--allow-metrics",
        "false",
    ]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    log = open(out / f"gateway-{tree.name}.log", "ab")
    gateway = subprocess.Popen(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: ready(port, model), 600, f"gateway from {tree} under callgrind")
        body = request_body(port, model)
        if grpc:
            request = grpc_request(body, model)
            load_grpc(grpc_port, request, args.warmup, args.concurrency, args.grpc_stream)
        else:
            load(port, model, body, args.warmup, args.concurrency)
        subprocess.run(["callgrind_control", "-z", str(gateway.pid)], check=True, capture_output=True)
        if grpc:
            load_grpc(grpc_port, request, args.requests, args.concurrency, args.grpc_stream)
        else:
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
    ap.add_argument("--grpc", action="store_true", help="gRPC ModelInfer calls instead of HTTP requests")
    ap.add_argument("--grpc-stream", action="store_true", help="gRPC ModelStreamInfer requests, one stream per thread")
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

#!/usr/bin/env python3
"""Which ASGI server answers a trivial Starlette route fastest (and with the least CPU)?

usage: python benchmarks/http_servers.py [--seconds 6] [--rounds 2]

A Starlette app with one POST route (reads the body, answers 60 bytes of JSON, as the
gateway's infer route does minus the bus) served by:
  uvicorn-asyncio-h11     uvicorn, asyncio loop, h11 parser (pure Python)
  uvicorn-uvloop-httptools uvicorn, uvloop, httptools (what Shoal's gateway runs today)
  granian-auto            granian --interface asgi, 1 worker, 1 runtime thread (its default loop)
  granian-uvloop, -asyncio same, --loop uvloop or asyncio
  raw-asgi-uvloop         uvicorn uvloop+httptools serving a bare ASGI callable (no Starlette)
  shoal-direct            uvicorn uvloop + Shoal's own protocol (services/gateway/http/protocol.py):
                          the gateway's inference path without ASGI, what `shoal serve` runs today
  granian-rsgi, -rsgi-uvloop  granian --interface rsgi (its own Rust protocol, no ASGI), 1 worker,
                          1 runtime thread; its default loop, or uvloop
loaded by wrk (keep-alive, 1 thread) at 1 and 16 connections, servers interleaved over
`--rounds`. Prints requests/s, p50 and server CPU µs per request (utime+stime from /proc).
`--callgrind` instead runs each server under valgrind's callgrind and prints the instructions per
request at 16 connections (every thread of the server), a count that the machine's load does not move.
Needs `wrk` (apt-get install wrk), `pip install granian`, and valgrind for `--callgrind`; run from the
repository root with it on PYTHONPATH (shoal-direct imports Shoal's protocol).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

APP = r"""
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

BODY = b'{"model_name":"simple","outputs":[{"name":"OUTPUT0","data":[1,2]}]}'

async def infer(request):
    await request.body()
    return Response(BODY, media_type="application/json")

async def ready(request):
    return Response(b"")

app = Starlette(routes=[Route("/v2/models/{name}/infer", infer, methods=["POST"]),
                        Route("/v2/health/ready", ready)])

class Direct:  # what Shoal's protocol calls for a claimed request (services/gateway/http/protocol.py)

    limit = 1 << 20

    def claim(self, method, path):
        return ("simple", "") if method == "POST" and path.endswith("/infer") else None

    async def respond(self, claim, headers, body, size, disconnect):
        return 200, BODY, {"content-type": "application/json"}

    async def __call__(self, scope, receive, send):
        await raw(scope, receive, send)


direct = Direct()


async def rsgi(scope, proto):
    if scope.method == "POST":
        await proto()
        proto.response_bytes(200, [("content-type", "application/json")], BODY)
    else:
        proto.response_empty(200, [])


async def raw(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": BODY})
"""

LUA = 'wrk.method = "POST"\nwrk.body = \'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"INT32","data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}]}\'\nwrk.headers["Content-Type"] = "application/json"\n'


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def servers(port: int, appdir: str) -> dict[str, list[str]]:
    py = sys.executable
    uv = [
        py,
        "-m",
        "uvicorn",
        "--app-dir",
        appdir,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    gr = [
        py,
        "-m",
        "granian",
        "--interface",
        "asgi",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--runtime-threads",
        "1",
        "--log-level",
        "warning",
        "--no-ws",
        "--working-dir",
        appdir,
    ]
    rsgi = [("rsgi" if a == "asgi" else a) for a in gr]
    return {
        "uvicorn-asyncio-h11": uv + ["--loop", "asyncio", "--http", "h11", "bench_app:app"],
        "uvicorn-uvloop-httptools": uv + ["--loop", "uvloop", "--http", "httptools", "bench_app:app"],
        "granian-auto": gr + ["bench_app:app"],
        "granian-uvloop": gr + ["--loop", "uvloop", "bench_app:app"],
        "granian-asyncio": gr + ["--loop", "asyncio", "bench_app:app"],
        "raw-asgi-uvloop": uv + ["--loop", "uvloop", "--http", "httptools", "bench_app:raw"],
        # --no-proxy-headers as the gateway: uvicorn's default wraps the app in its proxy-headers
        # middleware, and the protocol claims requests only for the app itself (else all go through ASGI)
        "shoal-direct": uv
        + ["--loop", "uvloop", "--no-proxy-headers", "--http", "services.gateway.http.protocol:CorkedHttpToolsProtocol"]
        + ["bench_app:direct"],
        "granian-rsgi": [*rsgi, "bench_app:rsgi"],
        "granian-rsgi-uvloop": [*rsgi, "--loop", "uvloop", "bench_app:rsgi"],
    }


def tree_cpu(root: int) -> float:
    total = 0.0
    pids, todo = [root], [root]
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                kids.setdefault(int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1]), []).append(int(d))
            except (OSError, IndexError):
                pass
    while todo:
        for k in kids.get(todo.pop(), []):
            pids.append(k)
            todo.append(k)
    for p in pids:
        try:
            f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            total += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError):
            pass
    return total


def wrk(port: int, conns: int, secs: int, lua: str) -> tuple[float, float, int]:
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{conns}",
            f"-d{secs}s",
            "--latency",
            "-s",
            lua,
            f"http://127.0.0.1:{port}/v2/models/simple/infer",
        ],
        capture_output=True,
        text=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    m = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
    p50 = float(m.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(2)]
    n = int(re.search(r"(\d+) requests in", out).group(1))
    return rps, p50, n


def tree_pids(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                kids.setdefault(int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1]), []).append(int(d))
            except (OSError, IndexError):
                pass
    pids, todo = [root], [root]
    while todo:
        for k in kids.get(todo.pop(), []):
            pids.append(k)
            todo.append(k)
    return pids


def wait_ready(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"no server on port {port} within {timeout} s") from None
            time.sleep(0.2)


def callgrind(name: str, appdir: str, lua: str, secs: int) -> float:
    """Instructions per request of the server's process tree at 16 connections, under callgrind."""
    port = free_port()
    out = os.path.join(appdir, f"cg-{name}-{port}")
    os.mkdir(out)
    cmd = ["valgrind", "--tool=callgrind", "--trace-children=yes", f"--callgrind-out-file={out}/callgrind.out.%p"]
    p = subprocess.Popen(cmd + servers(port, appdir)[name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, 300)
        wrk(port, 4, 2, lua)  # warm-up
        pids = [str(pid) for pid in tree_pids(p.pid)]
        for pid in pids:
            subprocess.run(["callgrind_control", "-z", pid], capture_output=True)
        _, _, n = wrk(port, 16, secs, lua)
        for pid in pids:
            subprocess.run(["callgrind_control", "-d", pid], capture_output=True)
        total = 0
        for pid in pids:
            dumps = sorted(f for f in os.listdir(out) if f.startswith(f"callgrind.out.{pid}."))
            for f in dumps[-1:]:
                m = re.search(r"^(?:summary|totals):\s+(\d+)", open(os.path.join(out, f)).read(), re.M)
                total += int(m.group(1)) if m else 0
        return total / n
    finally:
        p.terminate()
        p.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default="")
    ap.add_argument("--callgrind", action="store_true", help="instructions per request under callgrind instead")
    args = ap.parse_args()
    d = tempfile.mkdtemp()
    open(os.path.join(d, "bench_app.py"), "w").write(APP)
    lua = os.path.join(d, "post.lua")
    open(lua, "w").write(LUA)
    results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    names = list(servers(0, d))
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    if args.callgrind:
        for _ in range(args.rounds):
            for name in names:
                print(f"{name}: {callgrind(name, d, lua, args.seconds):,.0f} instructions per request", flush=True)
        return
    for _ in range(args.rounds):
        for name in names:
            port = free_port()
            p = subprocess.Popen(servers(port, d)[name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                for _ in range(100):
                    try:
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1)
                        break
                    except OSError:
                        time.sleep(0.1)
                wrk(port, 4, 1, lua)  # warm-up
                for conns in (1, 16):
                    c0 = tree_cpu(p.pid)
                    rps, p50, n = wrk(port, conns, args.seconds, lua)
                    cpu = (tree_cpu(p.pid) - c0) / n * 1e6
                    results.setdefault((name, conns), []).append((rps, p50, cpu))
            finally:
                p.terminate()
                p.wait(10)
    print("| server | c=1 req/s | c=1 p50 µs | c=16 req/s | c=16 server CPU µs/req |")
    print("|---|---|---|---|---|")
    for name in names:
        one, sixteen = results[(name, 1)], results[(name, 16)]

        def med(rows, i):
            return statistics.median(r[i] for r in rows)

        print(f"| {name} | {med(one, 0):,.0f} | {med(one, 1):.0f} | {med(sixteen, 0):,.0f} | {med(sixteen, 2):.0f} |")


if __name__ == "__main__":
    main()

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
loaded by wrk (keep-alive, 1 thread) at 1 and 16 connections, servers interleaved over
`--rounds`. Prints requests/s, p50 and server CPU µs per request (utime+stime from /proc).
Needs `wrk` (apt-get install wrk) and `pip install granian`.
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
    return {
        "uvicorn-asyncio-h11": uv + ["--loop", "asyncio", "--http", "h11", "bench_app:app"],
        "uvicorn-uvloop-httptools": uv + ["--loop", "uvloop", "--http", "httptools", "bench_app:app"],
        "granian-auto": gr + ["bench_app:app"],
        "granian-uvloop": gr + ["--loop", "uvloop", "bench_app:app"],
        "granian-asyncio": gr + ["--loop", "asyncio", "bench_app:app"],
        "raw-asgi-uvloop": uv + ["--loop", "uvloop", "--http", "httptools", "bench_app:raw"],
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    d = tempfile.mkdtemp()
    open(os.path.join(d, "bench_app.py"), "w").write(APP)
    lua = os.path.join(d, "post.lua")
    open(lua, "w").write(LUA)
    results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    names = list(servers(0, d))
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
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

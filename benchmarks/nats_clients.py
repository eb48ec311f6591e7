#!/usr/bin/env python3
"""nats-py (through shared/bus/, as the services use it) against natsrpy (Rust, async-nats) on the
pattern of Shoal's hot subscriptions: a request published with a reply subject, a subscriber's
callback that publishes the answer, a callback on the reply subject that completes a future.

usage: python benchmarks/nats_clients.py {nats-py,natsrpy} [--round-trips 20000] [--in-flight 16]
       python benchmarks/nats_clients.py --compare [--rounds 2]   (both, alternating, on one nats-server)

One process holds both ends (two connections, one uvloop loop), so the process's CPU time per round
trip is what two publishes and two deliveries cost a Shoal service. `--in-flight` requests are kept
outstanding, as a gateway under load keeps them. Prints CPU µs per round trip (all threads: natsrpy
runs a tokio runtime beside the loop) and round trips per second. For a count that the machine's load
does not move, run one client under `valgrind --tool=callgrind` twice with different `--round-trips`
and divide the difference (docs/performance.md, "Compiled code"). natsrpy: `pip install natsrpy`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop

PAYLOAD = b"x" * 200  # about a batch-1 request group on the bus


async def nats_py_requester(url: str) -> tuple[Callable[[bytes], Awaitable[None]], Callable[[], Awaitable[None]]]:
    from shared.bus import connection, hot_path

    requester = await connection.connect(url, "bench-requester")

    async def answered(msg: Any) -> None:  # the gateway's inbox: complete the waiting request
        _complete(msg.data)

    await hot_path.subscribe(requester, "bench.inbox", answered)
    await requester.flush()

    async def send(key: bytes) -> None:
        await requester.publish("bench.req", key + PAYLOAD, reply="bench.inbox")

    return send, requester.close


async def nats_py_responder(url: str) -> None:
    from shared.bus import connection, hot_path

    responder = await connection.connect(url, "bench-responder")

    async def serve(msg: Any) -> None:  # the scheduler's side: answer on the reply subject
        await responder.publish(msg.reply, msg.data)

    await hot_path.subscribe(responder, "bench.req", serve)
    await responder.flush()
    await _until_stdin_closes()
    await responder.close()


async def natsrpy_requester(url: str) -> tuple[Callable[[bytes], Awaitable[None]], Callable[[], Awaitable[None]]]:
    from natsrpy import Nats

    requester = Nats(addrs=[url])
    await requester.startup()

    async def answered(msg: Any) -> None:
        _complete(msg.payload)

    subscription = await requester.subscribe("bench.inbox", callback=answered).detatch()
    await requester.flush()

    async def send(key: bytes) -> None:
        await requester.publish("bench.req", key + PAYLOAD, reply="bench.inbox")

    async def close() -> None:
        await subscription.unsubscribe()
        await requester.shutdown()

    return send, close


async def natsrpy_responder(url: str) -> None:
    from natsrpy import Nats

    responder = Nats(addrs=[url])
    await responder.startup()

    async def serve(msg: Any) -> None:
        await responder.publish(msg.reply, msg.payload)

    subscription = await responder.subscribe("bench.req", callback=serve).detatch()
    await responder.flush()
    await _until_stdin_closes()
    await subscription.unsubscribe()
    await responder.shutdown()


PENDING: dict[bytes, asyncio.Future[None]] = {}


def _complete(data: bytes) -> None:
    future = PENDING.pop(data[:8], None)
    if future is not None:
        future.set_result(None)


async def _until_stdin_closes() -> None:
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(client: str, url: str, round_trips: int, in_flight: int) -> tuple[float, float, float]:
    """The responder in a child process, the requester here: CPU µs per round trip of each, and
    round trips per second."""
    responder = subprocess.Popen(
        [sys.executable, __file__, client, "--url", url, "--responder"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert responder.stdout is not None and responder.stdin is not None
        line = await asyncio.get_running_loop().run_in_executor(None, responder.stdout.readline)
        if line.strip() != b"ready":
            raise SystemExit("the responder did not start")
        send, close = await (nats_py_requester if client == "nats-py" else natsrpy_requester)(url)
        await _drive(send, round_trips // 4, in_flight)  # warm-up
        cpu0, child0, wall0 = time.process_time(), _cpu_s(responder.pid), time.perf_counter()
        done = await _drive(send, round_trips, in_flight)
        cpu, child = time.process_time() - cpu0, _cpu_s(responder.pid) - child0
        wall = time.perf_counter() - wall0
        await close()
        return cpu / done * 1e6, child / done * 1e6, done / wall
    finally:
        if responder.stdin is not None:
            responder.stdin.close()
        responder.wait(30)


async def _drive(send: Callable[[bytes], Awaitable[None]], round_trips: int, in_flight: int) -> int:
    """`in_flight` loops, each sending its next request when the last one is answered."""
    loop = asyncio.get_running_loop()
    per_loop = round_trips // in_flight

    async def one(index: int) -> None:
        for n in range(per_loop):
            key = f"{index:03d}{n:05d}".encode()[-8:]
            future = loop.create_future()
            PENDING[key] = future
            await send(key)
            await asyncio.wait_for(future, 10)

    await asyncio.gather(*(one(i) for i in range(in_flight)))
    return per_loop * in_flight


def compare(rounds: int, round_trips: int, in_flight: int) -> None:
    from shared.process.natsserver import NatsServer

    with NatsServer() as nats:
        for round_ in range(1, rounds + 1):
            for client in ("nats-py", "natsrpy"):
                cmd = [sys.executable, __file__, client, "--url", nats.url, "--round-trips", str(round_trips)]
                cmd += ["--in-flight", str(in_flight)]
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                print(f"round {round_} {client}: {(out.stdout or out.stderr).strip()}", flush=True)
    print("load average:", os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("client", nargs="?", choices=["nats-py", "natsrpy"])
    ap.add_argument("--url", default=None, help="a running nats-server (default: start one)")
    ap.add_argument("--round-trips", type=int, default=20000)
    ap.add_argument("--in-flight", type=int, default=16)
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--responder", action="store_true", help="(internal) the answering side, until stdin closes")
    args = ap.parse_args()
    if args.compare:
        compare(args.rounds, args.round_trips, args.in_flight)
        return
    if args.client is None:
        ap.error("name a client, or --compare")
    if args.responder:
        uvloop.run((nats_py_responder if args.client == "nats-py" else natsrpy_responder)(args.url))
        return

    async def go(url: str) -> tuple[float, float, float]:
        return await run(args.client, url, args.round_trips, args.in_flight)

    if args.url:
        requester, responder, rate = uvloop.run(go(args.url))
    else:
        from shared.process.natsserver import NatsServer

        with NatsServer() as nats:
            requester, responder, rate = uvloop.run(go(nats.url))
    print(
        f"cpu_us_per_round_trip requester {requester:.1f} responder {responder:.1f} "
        f"sum {requester + responder:.1f}; {rate:,.0f} round_trips_per_s"
    )


if __name__ == "__main__":
    main()

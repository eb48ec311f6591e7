#!/usr/bin/env python3
"""The cost of authenticated NATS on the request path (issue 44; docs/security.md, "What it costs").

nats-server checks a client's permissions at each publish and each delivery to a subscription.
This measures a co-hosted request's two bus messages (docs/design.md §7): the gateway publishes an
`ExecBatch` to a worker's `shoal.worker.<id>.exec`, and the worker answers with a `BatchDone` on the
gateway's `shoal.gw.<id>.reply.done`, as round trips on two nats-servers started here, one open and
one with `shoal serve`'s identities and permissions (the gateway's and the worker's nkeys), in
alternation (open, authenticated, open, ...), so that the machine's load drifts over both alike.

usage: python benchmarks/nats_auth.py [--round-trips 5000] [--rounds 3]

Prints, at 1 and 16 in flight, round trips per second and nats-server's own CPU time per round trip
(where the permission checks run: less moved by a loaded machine than the rate) for each server,
and the ratios authenticated / open (the issue's bound: a cost of at most 3 %).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.bus import connection  # noqa: E402
from shared.process import credentials  # noqa: E402
from shared.process.natsserver import NatsServer  # noqa: E402
from shared.wire import subjects  # noqa: E402

PAYLOAD = b"x" * 200  # about a batch-1 request on the bus


def cpu_seconds(pid: int) -> float:
    """A process's user and system CPU time so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def round_trips(url: str, gateway: str, worker: str, count: int, in_flight: int) -> float:
    """Round trips per second, `in_flight` outstanding at a time."""
    asking = await connection.connect(url, "bench-gateway", gateway)
    answering = await connection.connect(url, "bench-worker", worker)
    exec_subject, inbox = subjects.worker_exec("bench"), subjects.gateway_inbox("bench")
    waiting: asyncio.Queue[None] = asyncio.Queue()

    async def answer(msg: object) -> None:
        await answering.publish(subjects.batch_done(inbox), PAYLOAD)

    async def answered(msg: object) -> None:
        waiting.put_nowait(None)

    await answering.subscribe(exec_subject, cb=answer)
    await asking.subscribe(subjects.batch_done(inbox), cb=answered)
    await connection.settled(answering)
    await connection.settled(asking)
    started = time.perf_counter()
    for _ in range(in_flight):
        await asking.publish(exec_subject, PAYLOAD)
    for sent in range(in_flight, count + in_flight):
        await waiting.get()
        if sent < count:
            await asking.publish(exec_subject, PAYLOAD)
    elapsed = time.perf_counter() - started
    await asking.close()
    await answering.close()
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--round-trips", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    identities = credentials.make(Path(tempfile.mkdtemp(prefix="shoal-bench-auth-")))
    servers = {
        "open": (NatsServer().start(), "", ""),
        "authenticated": (
            NatsServer(authorization=identities.authorization()).start(),
            identities.file("gateway"),
            identities.file("worker"),
        ),
    }
    results: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}  # nats-server's CPU µs per round trip
    try:
        for _ in range(args.rounds):
            for in_flight in (1, 16):
                for name, (server, gateway, worker) in servers.items():
                    assert server.process is not None
                    before = cpu_seconds(server.process.pid)
                    rate = asyncio.run(round_trips(server.url, gateway, worker, args.round_trips, in_flight))
                    used = cpu_seconds(server.process.pid) - before
                    results.setdefault((name, in_flight), []).append(rate)
                    cpu.setdefault((name, in_flight), []).append(used / args.round_trips * 1e6)
    finally:
        for server, _, _ in servers.values():
            server.stop()
    print(f"load average {os.getloadavg()[0]:.2f}; {args.rounds} rounds of {args.round_trips} round trips")
    for in_flight in (1, 16):
        open_rate = statistics.median(results[("open", in_flight)])
        auth_rate = statistics.median(results[("authenticated", in_flight)])
        open_cpu = statistics.median(cpu[("open", in_flight)])
        auth_cpu = statistics.median(cpu[("authenticated", in_flight)])
        print(
            f"in flight {in_flight:2d}: open {open_rate:8.0f}/s, authenticated {auth_rate:8.0f}/s, "
            f"ratio {auth_rate / open_rate:.3f}; nats-server CPU per round trip {open_cpu:.1f} vs "
            f"{auth_cpu:.1f} µs, ratio {auth_cpu / open_cpu:.3f} (medians of {args.rounds})"
        )


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Instructions per request of the scheduler's own path, counted by callgrind: an A/B of source
trees for changes inside `services/scheduler/` whose cost the whole gateway's count
(`benchmarks/callgrind_gateway.py`) cannot resolve, as the timers of the other parts add noise of a
few percent per request.

usage: python benchmarks/scheduler_path.py TREE [TREE ...] [--requests 4000] [--batch 1] [--rounds 1] [--no-gc]

For each TREE, two runs of `SchedulerService` from that tree in one process under
`valgrind --tool=callgrind`, with `--requests` N and 2N: each request is handed over as the
co-hosting gateway does (`take`), goes out as an `ExecBatch` on a worker credit, and completes as
the worker's `InstanceFree` does (`Credits.on_free`). The difference of the two counts over N is
the path's instructions per request, start-up excluded. The bus is an in-process stand-in that
records what is published: nothing else runs. Runs of one tree still differ by about 1% (batch
ids start at random, and the collector's passes fall differently): compare several rounds, or
count with `--no-gc` (the collector off in the loop) for the code path alone. `--batch`
requests are taken at a time (a dynamic batcher then sends them as one batch). Needs `valgrind`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = "m"
WORKER = "w"
EXEC = "bench.worker.w.exec"


def drive(requests: int, batch: int, collect: bool) -> None:
    """The loop counted (run inside the tree under test)."""
    import gc

    import msgspec

    from services.scheduler.service import SchedulerService
    from shared.config.model_config import spec_from_json
    from shared.process.settings import SchedulerSettings
    from shared.wire.messages import ExecBatch, InstanceFree, RequestDone, RequestHeader, encode

    class Bus:
        """What the scheduler's parts use of a NATS client, in process."""

        max_payload = 1 << 20
        # batches go out by `publish`: shared/bus/hot_path.py's path while not connected
        is_connected = False
        _status, _transport = None, None

        def __init__(self) -> None:
            self.batches: list[ExecBatch] = []

        def new_inbox(self) -> str:
            return "_INBOX.bench.holdings"

        async def publish(self, subject: str, payload: bytes = b"", **_: object) -> None:
            if subject == EXEC:
                self.batches.append(msgspec.msgpack.decode(payload, type=ExecBatch))

    async def run() -> None:
        bus = Bus()
        service = SchedulerService(SchedulerSettings(scheduler_id="bench"), bus, local_inbox="_INBOX.bench")
        spec = spec_from_json({"name": MODEL, "max_batch_size": 8, "dynamic_batching": {}})
        service.pump.configure(service.pump.queue(MODEL, 1), spec)
        await service.credits.on_free(InstanceFree(WORKER, MODEL, 1, 0, EXEC))
        if not collect:
            gc.disable()
        done = 0
        while done < requests:
            raws = []
            for i in range(batch):
                header = RequestHeader(
                    f"r{done + i}", MODEL, 1, f"_INBOX.bench.{done + i}", time.time_ns() + 60 * 10**9, received_ns=1
                )
                raws.append(msgspec.Raw(encode(header)))
            await service.take(raws)
            sent = bus.batches.pop()
            rids = [msgspec.msgpack.decode(r, type=RequestHeader).rid for r in sent.requests]
            free = InstanceFree(
                WORKER, MODEL, 1, 0, EXEC, sent.credit, batch_id=sent.batch_id, batch_size=len(rids),
                done=[RequestDone(rid, True) for rid in rids],
            )  # fmt: skip
            await service.credits.on_free(free)
            done += len(rids)
        assert not bus.batches and service.pump.idle((MODEL, 1))

    asyncio.run(run())


def instructions(tree: Path, requests: int, batch: int, collect: bool, out: Path) -> int:
    dump = out / f"callgrind.{tree.name}.{requests}"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={dump}", sys.executable, __file__, "--drive"]
    cmd += ["--requests", str(requests), "--batch", str(batch)] + ([] if collect else ["--no-gc"])
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}  # the same dict layouts each run
    subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True)
    match = re.search(r"^(?:summary|totals):\s+(\d+)", dump.read_text(errors="replace"), re.M)
    if match is None:
        raise SystemExit(f"no totals in {dump}")
    return int(match.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", type=Path, nargs="*")
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--no-gc", action="store_true", help="the garbage collector off in the loop counted")
    ap.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)  # the counted child
    args = ap.parse_args()
    if args.drive:
        drive(args.requests, args.batch, not args.no_gc)
        return
    out = Path(tempfile.mkdtemp(prefix="scheduler-path-"))
    for round_ in range(1, args.rounds + 1):
        for tree in args.trees:
            tree = tree.resolve()
            short = instructions(tree, args.requests, args.batch, not args.no_gc, out)
            long = instructions(tree, 2 * args.requests, args.batch, not args.no_gc, out)
            per_request = (long - short) / args.requests
            print(f"round {round_} {tree} batch {args.batch}: {per_request:,.0f} instructions per request", flush=True)


if __name__ == "__main__":
    main()

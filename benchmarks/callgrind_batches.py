#!/usr/bin/env python3
"""Instructions per batch of the worker's batch path, counted by callgrind: an A/B of source trees
that the machine's load does not blur (docs/performance.md, "Compiled code").

usage: python benchmarks/callgrind_batches.py TREE [TREE ...] [--batches 2000] [--requests 2]
           [--cases inline,task] [--rounds 1] [--out DIR]

One nats-server on free ports. For each case and TREE in turn, a Python process runs that tree's
`services/worker/batches/batch_executor.py` (`env -C TREE PYTHONPATH=TREE`) under `valgrind --tool=callgrind`:
a `BatchExecutor` with one instance whose model doubles its input in Python (no backend's
instructions in the count), fed `ExecBatch` messages as the worker's subscription hands them over
(`BatchExecutor.start`), one batch at a time, each of `--requests` requests with inline inputs; a
batch ends when its completion (`InstanceFree`) comes back over NATS. After a warm-up the counters
are zeroed (`callgrind_control -z`), `--batches` batches run, and the counters are dumped: what one
batch costs from its arrival to its answers and completion on the socket (every thread: the loop,
the instance's thread, nats-py's reader).
Cases: `inline`, the common case (no Task: the instance's thread calls back on the loop);
`task`, the same batches with sequence controls, which take the path that awaits on the loop;
`publish`, a batch's messages alone written by `shared.bus.hot_path.publish_now` (one thread).
The whole-batch counts move by about ±10% between runs of one tree (the loop's thread and the
instance's thread hand the GIL to each other as wall-clock time says): take several `--rounds`.
`--calls N`: Python function calls per batch instead (no valgrind; the N most called), a count
that does not move.
Needs `valgrind` (apt-get install valgrind).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from callgrind_gateway import instructions  # noqa: E402

INBOX = "bench.gw.reply"


class Doubler:
    """A `Runner` (services/worker/backends/runner.py): OUT = 2 * IN, in Python."""

    batches_rows = False
    checks_readiness = False

    def execute(self, batch: Any) -> list[Any]:
        return [{"OUT": work.inputs["IN"] * 2} for work in batch.work]

    def is_ready(self) -> bool:
        return True

    def sequence_ended(self, correlation_id: int | str, reason: str) -> None:
        pass

    def close(self) -> None:
        pass


async def inner(nats_url: str, case: str, batches: int, warmup: int, requests: int, calls: bool) -> None:
    """Runs in the measured process, with the tree's code on sys.path; talks to the driver on stdio."""
    import msgspec
    import nats
    import numpy as np

    from services.worker.batches.batch_executor import BatchExecutor
    from services.worker.batches.completions import Completions
    from services.worker.batches.decoupled_streams import Cancellations, DecoupledSenders
    from services.worker.batches.instance_thread import InstanceThread
    from services.worker.batches.instances import Instance, LoadedModel
    from services.worker.batches.response_outputs import Outputs
    from shared.bus import connection
    from shared.bus.tensor_store import TensorStore
    from shared.config.model_config import spec_from_json
    from shared.wire import subjects
    from shared.wire.messages import ExecBatch, InferRequest, SeqControl, TensorRef, encode

    spec = spec_from_json(
        {
            "name": "m",
            "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [2]}],
            "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [2]}],
        }
    )
    nc = await nats.connect(nats_url)
    store = TensorStore(nc, "bench", transport="bus")
    cancellations, outputs = Cancellations(), Outputs(store)
    executor = BatchExecutor(
        "w",
        nc,
        store,
        outputs,
        cancellations,
        DecoupledSenders(nc, outputs.streamed, cancellations),
        Completions(nc, "w"),
    )
    instance = Instance(0, Doubler(), InstanceThread("bench-instance"), credits=1)
    loaded = LoadedModel(spec, 1, 1, [instance])
    done = asyncio.Event()

    async def on_free(msg: Any) -> None:
        done.set()

    await nc.subscribe(subjects.INSTANCE_FREE, cb=on_free)
    await connection.settled(nc)

    def batch(n: int) -> bytes:
        raws = []
        for i in range(requests):
            data = np.array([n, i], np.int32).tobytes()
            request = InferRequest(
                f"r{n}-{i}",
                "m",
                1,
                f"{INBOX}.r{i}",
                time.time_ns() + 10**10,
                inputs=[TensorRef("IN", "INT32", [2], data)],
            )
            raws.append(msgspec.Raw(encode(request)))
        controls = [SeqControl(corrid=i + 1, seq=n) for i in range(requests)] if case == "task" else []
        return encode(ExecBatch(n, "m", 1, 0, raws, [0] * requests, credit=0, generation=1, controls=controls))

    decoder = msgspec.msgpack.Decoder(ExecBatch)

    async def publish(count: int, first: int) -> None:
        """A batch's messages alone (two answers and a completion), as `publish_now` writes them."""
        from shared.bus import hot_path

        messages = [hot_path.Outgoing(f"{INBOX}.r{i}", bytes(120)) for i in range(requests)]
        messages.append(hot_path.Outgoing(subjects.INSTANCE_FREE, bytes(80)))
        for _ in range(count):
            if not hot_path.publish_now(nc, messages):
                await hot_path.publish_all(nc, messages)
            await asyncio.sleep(0)  # the socket drains

    async def run(count: int, first: int) -> None:
        if case == "publish":
            await publish(count, first)
            return
        payloads = [batch(first + n) for n in range(count)]  # built before: not counted
        for payload in payloads:
            done.clear()
            instance.idle.discard(0)
            work = executor.start(loaded, instance, decoder.decode(payload), True)
            if work is not None:
                await asyncio.ensure_future(work)
            await asyncio.wait_for(done.wait(), 60)

    await run(warmup, 0)
    gc.collect()
    gc.disable()  # the collector runs when allocations say, which the machine's timing moves: not counted
    # a thread waiting for the GIL takes it from the loop's thread after 5 ms of wall-clock time, and
    # valgrind's slowness and the machine's load decide how often that happens: only when it waits
    sys.setswitchinterval(10.0)
    print("warm", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # counters zeroed
    called: collections.Counter[str] = collections.Counter()
    if calls:  # Python function calls instead, on every thread

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                called[f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"] += 1

        threading.setprofile(profile)
        sys.setprofile(profile)
    await run(batches, warmup)
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    print("done", flush=True)
    if calls:
        print(json.dumps(called), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # counters dumped
    instance.executor.shutdown()
    await nc.close()


def measure(tree: Path, nats_url: str, case: str, args: argparse.Namespace, out: Path) -> float:
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/callgrind.out.%p"]
    cmd = [
        *([] if args.calls else [*valgrind, *args.valgrind_args.split()]),
        sys.executable,
        str(Path(__file__).resolve()),
        "--inner",
        nats_url,
        "--cases",
        case,
        "--batches",
        str(args.batches),
        "--warmup",
        str(args.warmup),
        "--requests",
        str(args.requests),
        *(["--calls", str(args.calls)] if args.calls else []),
    ]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    log = open(out / f"inner-{tree.name}-{case}.log", "ab")
    proc = subprocess.Popen(
        cmd, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        if proc.stdout.readline().strip() != "warm":
            raise SystemExit(f"{tree} {case}: the measured process ended early (see {log.name})")
        if not args.calls:
            subprocess.run(["callgrind_control", "-z", str(proc.pid)], check=True, capture_output=True)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        if proc.stdout.readline().strip() != "done":
            raise SystemExit(f"{tree} {case}: the measured process failed (see {log.name})")
        if args.calls:
            called = json.loads(proc.stdout.readline())
            top = sorted(called.items(), key=lambda kv: -kv[1])[: args.calls]
            for name, count in top:
                print(f"    {count / args.batches:8.2f}  {name}")
            total = sum(called.values())
        else:
            subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        proc.wait(300)
        return (total if args.calls else instructions(out, proc.pid)) / args.batches
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--requests", type=int, default=2, help="requests per batch")
    ap.add_argument("--cases", default="inline,task")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--calls", type=int, default=0, help="count Python calls instead (no valgrind); show the N most")
    ap.add_argument("--valgrind-args", default="", help="more options for valgrind, e.g. --fair-sched=yes")
    args = ap.parse_args()
    if args.inner:
        try:  # the worker's loop (shared/process/runtime.py)
            import uvloop

            factory: Any = uvloop.new_event_loop
        except ImportError:
            factory = None
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(inner(args.trees[0], args.cases, args.batches, args.warmup, args.requests, args.calls))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from shared.process.natsserver import NatsServer

    out = (args.out or Path(tempfile.mkdtemp(prefix="callgrind-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    server = NatsServer().start()
    try:
        for round_ in range(1, args.rounds + 1):
            for case in args.cases.split(","):
                for tree in args.trees:
                    per_batch = measure(Path(tree).resolve(), server.url, case, args, out)
                    print(
                        f"round {round_} {tree} {case} ({args.requests} requests a batch): "
                        f"{per_batch:,.{1 if args.calls else 0}f} {'Python calls' if args.calls else 'instructions'} per batch",
                        flush=True,
                    )
    finally:
        server.stop()


if __name__ == "__main__":
    main()

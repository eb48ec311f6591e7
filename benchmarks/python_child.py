#!/usr/bin/env python3
"""The python model process's cost per request, per thread (issue 23, item 2).

    python benchmarks/python_child.py MODEL_REPO [--model simple] [--concurrency 16] [--seconds 10]
                                      [--rounds 2] [--strace] [--shoal-cmd "shoal"]

Starts `shoal serve` on MODEL_REPO (free ports; e.g. the repository `../shared/bench/models.py`
writes), loads MODEL with the asyncio tritonclient load generator at the given concurrency, and
over a window past warm-up reads, for the python model's own process only, the CPU time of each
of its threads (`/proc/PID/task/TID/schedstat`, nanoseconds on CPU) and the requests served
(the gateway's statistics). Prints CPU µs per request per thread name and in all, and the mean
batch size. `--strace` also counts the process's system calls per request (`strace -c -f`, which
slows the process: its CPU figures are not comparable then).

`--callgrind N` counts instructions instead, which a loaded machine does not disturb: a nats-server
and the services without a worker (`shoal.supervisor.Cluster`), and the model's process started by
hand as what isolation starts (`shoal worker --models MODEL --python-isolation none`) under `valgrind --tool=callgrind --separate-threads=yes`;
after a warm-up the counters are zeroed, exactly N requests are sent at the given concurrency, and
the instructions per request of each thread are printed (`callgrind_control -z` / `-d`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import asyncio_load  # noqa: E402
from vs_triton import Shoal, label, served, tree  # noqa: E402


def threads_ns(pid: int) -> dict[str, int]:
    """CPU nanoseconds per thread: `loop` is the main thread (the event loop), the others by
    thread id (CPython 3.11 does not name its threads for the kernel)."""
    out: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ns = int((task / "schedstat").read_text().split()[0])
        except OSError:
            continue
        out["loop" if task.name == str(pid) else f"tid {task.name}"] = ns
    return out


def executions(http: str, model: str) -> int:
    with urllib.request.urlopen(f"http://{http}/v2/models/{model}/stats", timeout=10) as r:
        return sum(m["execution_count"] for m in json.load(r)["model_stats"])


def child_pid(root: int, model: str) -> int:
    """The process of the model's first instance (it names itself `py0:<model>`, or `py:<model>`
    with `--python-isolation model`)."""
    for pid in tree(root):
        if label(pid) == "worker (python model child)":
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            if comm in (f"py0:{model}"[:15], f"py:{model}"[:15]):
                return pid
    raise RuntimeError(f"no process of python model '{model}' found")


def strace_counts(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1].isidentifier() and parts[-1] != "total":
            calls = parts[3]
            if calls.isdigit():
                counts[parts[-1]] = int(calls)
    return counts


def measure(http: str, model: str, pid: int, concurrency: int, seconds: float, strace: bool) -> dict:
    inputs = {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16), "INPUT1": np.ones((1, 16), np.int32)}
    warm = 3.0
    load = threading.Thread(
        target=lambda: asyncio.run(asyncio_load(http, model, inputs, concurrency, warm + seconds + 2)), daemon=True
    )
    load.start()
    time.sleep(warm)
    tracer, trace_out = None, Path(tempfile.mkstemp(suffix=".strace")[1])
    if strace:
        tracer = subprocess.Popen(
            ["strace", "-c", "-f", "-p", str(pid), "-o", str(trace_out)], stderr=subprocess.DEVNULL
        )
        time.sleep(0.5)
    n0, e0, t0 = served(http, model), executions(http, model), threads_ns(pid)
    time.sleep(seconds)
    n1, e1, t1 = served(http, model), executions(http, model), threads_ns(pid)
    if tracer is not None:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(30)
    load.join()
    n = max(1, n1 - n0)
    per_thread = {k: round((t1.get(k, 0) - t0.get(k, 0)) / n / 1e3, 1) for k in t1}
    per_thread = {k: v for k, v in sorted(per_thread.items(), key=lambda kv: -kv[1]) if v >= 0.1}
    result = {
        "requests": n,
        "req_per_s": round(n / seconds),
        "mean_batch": round(n / max(1, e1 - e0), 2),
        "cpu_us_per_request": per_thread,
        "total_us": round(sum(per_thread.values()), 1),
    }
    if strace:
        calls = strace_counts(trace_out)
        result["syscalls_per_request"] = {k: round(v / n, 2) for k, v in sorted(calls.items(), key=lambda kv: -kv[1])}
        result["syscalls_total"] = round(sum(calls.values()) / n, 2)
    trace_out.unlink(missing_ok=True)
    return result


def send(http: str, model: str, requests: int, concurrency: int) -> None:
    import tritonclient.http as httpclient

    a = np.arange(16, dtype=np.int32).reshape(1, 16)

    def one_client(count: int) -> None:
        client = httpclient.InferenceServerClient(http, network_timeout=120)
        tensors = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for t in tensors:
            t.set_data_from_numpy(a)
        for _ in range(count):
            client.infer(model, tensors)
        client.close()

    clients = [threading.Thread(target=one_client, args=(requests // concurrency,)) for _ in range(concurrency)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()


def instructions(out_dir: Path, pid: int) -> dict[str, int]:
    """Ir of each thread in the last dump (callgrind numbers threads from 1: 1 is the main one)."""
    counts: dict[str, int] = {}
    for f in out_dir.glob(f"cg.{pid}.*"):
        text = f.read_text(errors="replace")
        thread = re.search(r"^thread: (\d+)", text, re.M)
        total = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
        if thread and total:
            counts["loop" if thread[1] == "1" else f"thread {thread[1]}"] = int(total[1])
    return counts


def callgrind(repo: Path, model: str, requests: int, concurrency: int) -> dict:
    from shared.process.natsserver import NatsServer, free_port, wait_for_port
    from shared.process.settings import GatewaySettings, RepositorySettings, SchedulerSettings
    from shoal.supervisor import Cluster

    nats = NatsServer().start()
    common = {"nats_url": nats.url}
    gateway = GatewaySettings(
        **common,
        http_address="127.0.0.1",
        http_port=free_port(),
        metrics_port=free_port(),
        grpc_address="127.0.0.1",
        grpc_port=free_port(),
    )
    # as `shoal serve` runs it: the scheduler in the gateway where the tree can co-host it
    cohosts = "cohost_scheduler" in GatewaySettings.model_fields
    cluster = Cluster(
        gateway,
        None if cohosts else SchedulerSettings(**common),
        RepositorySettings(**common, model_repository=str(repo)),
        [],
        supervise=False,
    ).start()
    try:
        wait_for_port(gateway.http_port, 60)
        return _callgrind(nats.url, f"127.0.0.1:{gateway.http_port}", model, requests, concurrency)
    finally:
        cluster.stop(timeout=10)
        nats.stop()


def _callgrind(nats_url: str, http: str, model: str, requests: int, concurrency: int) -> dict:
    out_dir = Path(tempfile.mkdtemp(prefix="python_child_cg."))
    argv = ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out_dir}/cg.%p"]
    argv += [sys.executable, "-m", "shoal.cli", "worker", "--nats-url", nats_url]
    argv += ["--models", model, "--python-isolation", "none", "--worker-id", "callgrind"]
    worker = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(out_dir / "worker.log", "w"))
    try:
        deadline = time.monotonic() + 900  # numpy and the model imported under valgrind, on a loaded machine
        while True:
            try:
                if urllib.request.urlopen(f"http://{http}/v2/models/{model}/ready", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError(f"the worker under callgrind did not get ready: {out_dir}/worker.log")
            time.sleep(1)
        send(http, model, 50 * concurrency, concurrency)  # warm-up
        subprocess.run(["callgrind_control", "-z", str(worker.pid)], check=True, capture_output=True)
        n0 = served(http, model)
        send(http, model, requests, concurrency)
        n = served(http, model) - n0
        for f in out_dir.glob("cg.*"):
            f.unlink()
        subprocess.run(["callgrind_control", "-d", str(worker.pid)], check=True, capture_output=True)
        per_thread = {k: round(v / n) for k, v in instructions(out_dir, worker.pid).items()}
        return {"requests": n, "instructions_per_request": per_thread, "total": sum(per_thread.values())}
    finally:
        worker.send_signal(signal.SIGINT)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("repo", type=Path)
    ap.add_argument("--model", default="simple")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--strace", action="store_true")
    ap.add_argument("--callgrind", type=int, default=0, metavar="N", help="count instructions over N requests")
    ap.add_argument("--shoal-cmd", default="shoal")
    ap.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "python_child_shoal.log")
    args = ap.parse_args()
    if args.callgrind:
        for _ in range(args.rounds):
            print(json.dumps(callgrind(args.repo, args.model, args.callgrind, args.concurrency)), flush=True)
        return
    shoal = Shoal(shlex.split(args.shoal_cmd), args.repo, args.log, None)
    try:
        shoal.start([args.model])
        assert shoal.proc is not None
        pid = child_pid(shoal.proc.pid, args.model)
        http = f"127.0.0.1:{shoal.http}"
        for _ in range(args.rounds):
            print(json.dumps(measure(http, args.model, pid, args.concurrency, args.seconds, args.strace)), flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        left = shoal.stop()
        if left:
            print("WARNING: left behind:", left, file=sys.stderr)


if __name__ == "__main__":
    main()

"""Throughput with workers on 1, 2, 3 separate hosts (issue 27; docs/reliability.md, "Across hosts").

    python benchmarks/hosts_scale.py --hosts 1,2,3 --seconds 10 --concurrency 8 --model mlp

Each run makes 1 + N hosts with tests/hosts.py (network namespaces on one bridge, each with its own
/dev/shm and NATS node of one cluster; root needed): the gateway, scheduler and repository on host 1,
one worker on each of hosts 2..N+1. Closed-loop HTTP clients on host 1 send the example `mlp`
(ONNX 256→1024→1024→16, dynamic batching; a [4, 256] FP32 input, 4 KiB: inline) or `identity_fp32`
for `--seconds` after a warm-up; the table gives requests/s, p50 and p99 latency, and how the
executions spread over the worker hosts (the workers' micro status).

All hosts share this machine's cores: the figure shows what crossing hosts costs and whether
adding worker hosts adds throughput when the workers are the bottleneck, not what N machines give.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tritonclient.http as httpclient  # noqa: E402

from services.repository import examples  # noqa: E402
from shoal import topology  # noqa: E402
from tests.hosts import Hosts, namespaces_refused, running_hosts  # noqa: E402
from tests.serving import wait_until  # noqa: E402

INPUTS = {"mlp": ("INPUT0", [4, 256]), "identity_fp32": ("INPUT0", [1, 16])}


def client_loop(url: str, model: str, stop: threading.Event, latencies: list[float]) -> None:
    name, shape = INPUTS[model]
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    tensor = httpclient.InferInput(name, shape, "FP32")
    tensor.set_data_from_numpy(np.ones(shape, np.float32), binary_data=True)
    while not stop.is_set():
        started = time.monotonic()
        client.infer(model, [tensor])
        latencies.append(time.monotonic() - started)
    client.close()


def executions(hosts: Hosts, model: str) -> dict[str, int]:
    services = asyncio.run(topology.collect(hosts.nats_url(hosts[1]), wait=0.3))
    return {
        s["metadata"]["host"]: sum(
            i["executions"] for i in s["status"].get("models", {}).get(f"{model}/1", {}).get("instance_list", [])
        )
        for s in services
        if s["name"] == "shoal-worker"
    }


def measure(worker_hosts: int, model: str, seconds: float, concurrency: int, warmup: float) -> dict:
    models = Path(tempfile.mkdtemp(prefix="shoal-hosts-models-"))
    examples.write_examples(models)
    with running_hosts(1 + worker_hosts) as hosts:
        hosts.serve(models, repository={"model_control_mode": "explicit", "load_model": [model]})
        gateway = hosts[1]

        def ready() -> bool:
            client = httpclient.InferenceServerClient(hosts.url)
            try:
                if not client.is_model_ready(model):
                    return False
            except Exception:
                return False
            finally:
                client.close()
            return len(executions(hosts, model)) == worker_hosts

        gateway.call(wait_until, ready, 180, f"'{model}' not ready on {worker_hosts} worker host(s)")
        stop = threading.Event()
        per_client: list[list[float]] = [[] for _ in range(concurrency)]
        threads = [gateway.thread(client_loop, hosts.url, model, stop, lat) for lat in per_client]
        time.sleep(warmup)
        before = gateway.call(executions, hosts, model)
        counts = [len(lat) for lat in per_client]
        time.sleep(seconds)
        done = [lat[n:] for lat, n in zip(per_client, counts)]
        after = gateway.call(executions, hosts, model)
        stop.set()
        for thread in threads:
            thread.join(60)
    latencies = sorted(x for lat in done for x in lat)
    return {
        "worker_hosts": worker_hosts,
        "requests_per_s": round(len(latencies) / seconds, 1),
        "p50_ms": round(1000 * latencies[len(latencies) // 2], 2) if latencies else None,
        "p99_ms": round(1000 * latencies[int(len(latencies) * 0.99)], 2) if latencies else None,
        "executions_per_host": {h: after.get(h, 0) - before.get(h, 0) for h in sorted(after)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1,2,3", help="worker host counts to measure")
    parser.add_argument("--model", default="mlp", choices=sorted(INPUTS))
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--warmup", type=float, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    refused = namespaces_refused()
    if refused:
        sys.exit(f"cannot make hosts here: {refused}")
    runs = [measure(int(n), args.model, args.seconds, args.concurrency, args.warmup) for n in args.hosts.split(",")]
    print(f"model {args.model}, concurrency {args.concurrency}, {args.seconds:.0f} s, load {os.getloadavg()[0]:.1f}")
    print("| worker hosts | requests/s | p50 ms | p99 ms | executions per host |\n|---|---|---|---|---|")
    for run in runs:
        print(
            f"| {run['worker_hosts']} | {run['requests_per_s']} | {run['p50_ms']} | {run['p99_ms']} "
            f"| {json.dumps(run['executions_per_host'])} |"
        )
    print(json.dumps(runs))


if __name__ == "__main__":
    main()

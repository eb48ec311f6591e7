"""Models on demand: cold-start latency, and a Zipf workload over many models with room for few.

Generates a repository of `--models` identity ONNX models, then runs `shoal serve` twice on it:

1. `--model-control-mode=on-demand --max-loaded-models=<room>`: the first request of a few
   models (cold start: the request waits while its model loads), the same models again (warm),
   then `--requests` requests whose models follow a Zipf law (rank k drawn with probability
   proportional to 1/k^s), sent by `--concurrency` clients;
2. every model loaded at start (`--model-control-mode=none`), the same workload.

It prints throughput, latency percentiles, the hit rate (requests that found their model
loaded: 1 - on-demand loads / requests), evictions and thrash, and writes them as JSON.

    python -m benchmarks.on_demand --models 100 --room 10 --requests 3000 --concurrency 4
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto

from services.repository import examples
from shared.process.natsserver import free_port
from tests.cluster import identity_config
from tests.serving import Serve

COLD_MODELS = 5


def write_repository(root: Path, count: int) -> list[str]:
    names = [f"z{i:03d}" for i in range(count)]
    for name in names:
        examples.write_model(
            root, name, examples.identity_graph(TensorProto.FLOAT, 2, name), identity_config(name, "FP32")
        )
    return names


def zipf_workload(names: list[str], requests: int, s: float, seed: int) -> list[str]:
    weights = 1.0 / np.arange(1, len(names) + 1) ** s
    rng = np.random.default_rng(seed)
    ranks = rng.permutation(len(names))  # which model is popular is not the repository's order
    picks = rng.choice(len(names), size=requests, p=weights / weights.sum())
    return [names[ranks[p]] for p in picks]


def _infer(url: str, model: str) -> float:
    import tritonclient.http as httpclient

    client = getattr(_clients, url, None)
    if client is None:  # one client per thread: a tritonclient HTTP client is not thread-safe
        client = httpclient.InferenceServerClient(url)
        setattr(_clients, url, client)
    data = np.ones((1, 4), dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(data)
    started = time.perf_counter()
    client.infer(model, [tensor])
    return time.perf_counter() - started


_clients = threading.local()


def _metrics(serve: Serve) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{serve.metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("shoal_model_"):
            name = line.split("{", 1)[0]
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def run_workload(serve: Serve, workload: list[str], concurrency: int) -> dict[str, Any]:
    before = _metrics(serve)
    errors: list[str] = []
    latencies: list[float] = []

    def one(model: str) -> None:
        try:
            latencies.append(_infer(serve.url, model))
        except Exception as exc:
            errors.append(str(exc))

    chunks = [workload[i::concurrency] for i in range(concurrency)]
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda chunk: [one(m) for m in chunk], chunks))
    elapsed = time.perf_counter() - started
    after = _metrics(serve)
    loads = after.get("shoal_model_loads_total", 0) - before.get("shoal_model_loads_total", 0)
    ms = np.array(latencies) * 1000
    return {
        "requests": len(workload),
        "errors": len(errors),
        "first_errors": errors[:3],
        "seconds": round(elapsed, 2),
        "throughput": round(len(workload) / elapsed, 1),
        "p50_ms": round(float(np.percentile(ms, 50)), 2) if len(ms) else None,
        "p99_ms": round(float(np.percentile(ms, 99)), 2) if len(ms) else None,
        "loads": int(loads),
        "hit_rate": round(1 - loads / len(workload), 4),
        "evictions": int(after.get("shoal_model_evictions_total", 0) - before.get("shoal_model_evictions_total", 0)),
        "thrash": int(after.get("shoal_model_thrash_total", 0) - before.get("shoal_model_thrash_total", 0)),
    }


def cold_start(serve: Serve, names: list[str]) -> dict[str, Any]:
    cold = [_infer(serve.url, name) * 1000 for name in names[:COLD_MODELS]]
    warm = [_infer(serve.url, name) * 1000 for name in names[:COLD_MODELS]]
    return {"cold_ms": [round(c, 1) for c in cold], "warm_ms": [round(w, 2) for w in warm]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--room", type=int, default=10, help="--max-loaded-models of the on-demand run")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--zipf", type=float, default=1.1, help="the Zipf exponent s")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/on_demand/on_demand.json"))
    args = parser.parse_args()
    results: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        names = write_repository(root, args.models)
        workload = zipf_workload(names, args.requests, args.zipf, args.seed)
        on_demand = [
            f"--model-repository={root}",
            f"--grpc-port={free_port()}",
            "--model-control-mode=on-demand",
            f"--max-loaded-models={args.room}",
        ]
        serve = Serve(Path(tmp) / "on-demand", on_demand).start()
        try:
            results["cold_start"] = cold_start(serve, names)
            results["on_demand"] = run_workload(serve, workload, args.concurrency)
        finally:
            serve.terminate(60)
        all_loaded = [f"--model-repository={root}", f"--grpc-port={free_port()}"]
        serve = Serve(Path(tmp) / "all-loaded", all_loaded).start(ready_timeout=600)
        try:
            results["all_loaded"] = run_workload(serve, workload, args.concurrency)
        finally:
            serve.terminate(60)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

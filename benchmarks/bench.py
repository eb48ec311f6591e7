"""Shoal vs in-process onnxruntime on the example models, measured in one run.

    python benchmarks/bench.py                      # starts Shoal itself on free ports
    python benchmarks/bench.py --url 127.0.0.1:8000 # against a running server

Load comes from Triton's perf_analyzer when `benchmarks/get_perf_analyzer.sh` has
installed it (binary tensors over HTTP, exactly as Triton users measure), otherwise
from a bounded asyncio load generator using tritonclient's aio client. The baseline
is onnxruntime in this process on the same model file with the same session settings
as Shoal's instances. Results go to stdout and `bench-out/<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PERF_ANALYZER = ROOT / "benchmarks" / ".tools" / "perf_analyzer"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def in_process_onnxruntime(
    model_file: Path, shape: tuple[int, ...], dtype, instances: int, concurrency: int, seconds: float
) -> dict:
    """The baseline: `concurrency` threads calling `instances` sessions directly, batch 1."""
    import onnxruntime as ort

    from services.worker.backends import default_threads

    options = ort.SessionOptions()
    options.intra_op_num_threads = default_threads(instances)
    options.inter_op_num_threads = 1
    sessions = [
        ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"]) for _ in range(instances)
    ]
    locks = [threading.Lock() for _ in sessions]
    feeds = {i.name: np.ones(shape, dtype) for i in sessions[0].get_inputs()}
    latencies: list[float] = []
    stop = time.monotonic() + seconds

    def loop(k: int) -> None:
        index = k % len(sessions)
        while time.monotonic() < stop:
            t = time.perf_counter()
            with locks[index]:
                sessions[index].run(None, feeds)
            latencies.append(time.perf_counter() - t)

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(concurrency)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    return {
        "throughput": len(latencies) / elapsed,
        "p50_us": percentile(latencies, 0.5) * 1e6,
        "p99_us": percentile(latencies, 0.99) * 1e6,
    }


def perf_analyzer(url: str, model: str, concurrency: int, seconds: float, stability: int = 25) -> dict:
    out = subprocess.run(
        [
            str(PERF_ANALYZER),
            "-m",
            model,
            "-u",
            url,
            "--concurrency-range",
            str(concurrency),
            "--measurement-interval",
            str(int(seconds * 1000)),
            "--max-trials",
            "10",
            "--stability-percentage",
            str(stability),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed:\n{text[-2000:]}")

    def grab(pattern: str) -> float:
        found = re.search(pattern, text)
        return float(found.group(1)) if found else float("nan")

    return {
        "throughput": grab(r"Throughput: ([\d.]+) infer/sec"),
        "p50_us": grab(r"p50 latency: (\d+) usec"),
        "p99_us": grab(r"p99 latency: (\d+) usec"),
        "avg_batch": grab(r"Inference count: (\d+)") / max(1.0, grab(r"Execution count: (\d+)")),
    }


async def asyncio_load(url: str, model: str, inputs: dict, concurrency: int, seconds: float) -> dict:
    import tritonclient.http.aio as aioclient

    client = aioclient.InferenceServerClient(url, conn_limit=concurrency)
    latencies: list[float] = []
    stop = time.monotonic() + seconds

    async def loop() -> None:
        while time.monotonic() < stop:
            tensors = []
            for name, value in inputs.items():
                tensor = aioclient.InferInput(name, list(value.shape), "FP32" if value.dtype == np.float32 else "INT32")
                tensor.set_data_from_numpy(value)
                tensors.append(tensor)
            t = time.perf_counter()
            await client.infer(model, tensors)
            latencies.append(time.perf_counter() - t)

    start = time.monotonic()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    elapsed = time.monotonic() - start
    await client.close()
    return {
        "throughput": len(latencies) / elapsed,
        "p50_us": percentile(latencies, 0.5) * 1e6,
        "p99_us": percentile(latencies, 0.99) * 1e6,
    }


MODELS = {
    # name: (input shape of one request, dtype, instance count in the example config)
    "simple": ((1, 16), np.int32, 1),
    "mlp": ((1, 256), np.float32, 2),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running Shoal (host:port); default: start one")
    parser.add_argument("--models", default="simple,mlp")
    parser.add_argument("--concurrency", default="1,2,4,8,16")
    parser.add_argument("--seconds", type=float, default=4.0, help="measurement window per point")
    parser.add_argument("--loadgen", choices=["auto", "perf_analyzer", "asyncio"], default="auto")
    args = parser.parse_args()

    from services.repository.examples import write_examples

    repository = write_examples(Path(tempfile.mkdtemp(prefix="shoal-bench-")))
    use_pa = args.loadgen == "perf_analyzer" or (args.loadgen == "auto" and PERF_ANALYZER.exists())
    cluster_ctx = None
    url = args.url
    if url is None:
        from tests.cluster import running_cluster

        cluster_ctx = running_cluster(repository)
        url = cluster_ctx.__enter__().url
    results: list[dict] = []
    try:
        for model in args.models.split(","):
            shape, dtype, instances = MODELS[model]
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                if use_pa:
                    shoal = perf_analyzer(url, model, concurrency, args.seconds)
                else:
                    inputs = {"INPUT0": np.ones(shape, dtype)}
                    if model == "simple":
                        inputs["INPUT1"] = np.ones(shape, dtype)
                    shoal = asyncio.run(asyncio_load(url, model, inputs, concurrency, args.seconds))
                local = in_process_onnxruntime(
                    repository / model / "1" / "model.onnx", shape, dtype, instances, concurrency, args.seconds
                )
                row = {
                    "model": model,
                    "concurrency": concurrency,
                    "shoal": shoal,
                    "onnxruntime_in_process": local,
                    "throughput_ratio": shoal["throughput"] / local["throughput"],
                }
                results.append(row)
                print(
                    f"{model:7s} c={concurrency:<3d} shoal {shoal['throughput']:8.0f}/s p50 {shoal['p50_us']:7.0f}us"
                    f" | in-process ORT {local['throughput']:8.0f}/s p50 {local['p50_us']:6.0f}us"
                    f" | ratio {row['throughput_ratio']:.2f}"
                    + (f" | avg batch {shoal['avg_batch']:.1f}" if "avg_batch" in shoal else ""),
                    flush=True,
                )
    finally:
        if cluster_ctx is not None:
            cluster_ctx.__exit__(None, None, None)
    out_dir = ROOT / "bench-out"
    out_dir.mkdir(exist_ok=True)
    meta = {"loadgen": "perf_analyzer" if use_pa else "asyncio", "cpus": os.cpu_count(), "results": results}
    path = out_dir / f"{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(meta, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

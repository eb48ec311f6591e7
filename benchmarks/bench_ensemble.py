"""Ensemble overhead: one ensemble request vs. the client calling the same steps itself.

    python benchmarks/bench_ensemble.py                 # starts Shoal on free ports
    python benchmarks/bench_ensemble.py --seconds 5 --concurrency 1,8 --elements 256,65536

The graph is the classic preprocess -> (classify || segment) on small ONNX models
(x*2, sum over the row, x*3; one CPU instance each, dynamic batching). Two ways to get
the same answers, same models, same server, one run:

- `ensemble`: one request to `pipeline`; the scheduler runs the steps, intermediates stay
  in the workers' memory / shared memory.
- `client`: the client calls `preprocess`, downloads its output, then sends it to
  `classify` and `segment` concurrently (the best a client can do: branches in parallel).

Load comes from tritonclient's asyncio HTTP client (perf_analyzer cannot chain calls).
Prints p50/p99 latency and throughput per mode, and the ensemble/client ratios; writes
`bench-out/ensemble-<timestamp>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services.repository.examples import write_model  # noqa: E402

CONFIG = """name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ {out} ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

ENSEMBLE = """name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "MASK" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling {
  step [ { model_name: "preprocess" model_version: -1 input_map { key: "X" value: "RAW" } output_map { key: "Y" value: "pre" } },
         { model_name: "classify" model_version: -1 input_map { key: "X" value: "pre" } output_map { key: "Y" value: "SCORES" } },
         { model_name: "segment" model_version: -1 input_map { key: "X" value: "pre" } output_map { key: "Y" value: "MASK" } } ]
}
"""


def _graph(name: str, op: str):
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", "n"])
    if op == "sum":
        y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 1])
        axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
        return helper.make_graph(
            [helper.make_node("ReduceSum", ["X", "axes"], ["Y"], keepdims=1)], name, [x], [y], [axes]
        )
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", "n"])
    k = numpy_helper.from_array(np.array(2.0 if op == "double" else 3.0, np.float32), "k")
    return helper.make_graph([helper.make_node("Mul", ["X", "k"], ["Y"])], name, [x], [y], [k])


def build_repository(root: Path) -> Path:
    for name, op, out in (("preprocess", "double", "-1"), ("classify", "sum", "1"), ("segment", "triple", "-1")):
        write_model(root, name, _graph(name, op), CONFIG.format(name=name, out=out))
    (root / "pipeline" / "1").mkdir(parents=True)
    (root / "pipeline" / "config.pbtxt").write_text(ENSEMBLE)
    return root


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(url: str, mode: str, elements: int, concurrency: int, seconds: float) -> dict:
    import tritonclient.http.aio as aioclient

    client = aioclient.InferenceServerClient(url, conn_limit=concurrency * 2)
    raw = np.random.default_rng(0).random((1, elements), dtype=np.float32)

    def tensor(name: str, value: np.ndarray):
        t = aioclient.InferInput(name, list(value.shape), "FP32")
        t.set_data_from_numpy(value)
        return t

    async def one() -> None:
        if mode == "ensemble":
            result = await client.infer("pipeline", [tensor("RAW", raw)])
            mask = result.as_numpy("MASK")
        else:
            pre = (await client.infer("preprocess", [tensor("X", raw)])).as_numpy("Y")
            _, seg = await asyncio.gather(
                client.infer("classify", [tensor("X", pre)]), client.infer("segment", [tensor("X", pre)])
            )
            mask = seg.as_numpy("Y")
        assert mask.shape == raw.shape

    for _ in range(3):  # warm the connections and the sessions
        await one()
    latencies: list[float] = []
    stop = time.monotonic() + seconds

    async def loop() -> None:
        while time.monotonic() < stop:
            t = time.perf_counter()
            await one()
            latencies.append(time.perf_counter() - t)

    start = time.monotonic()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    elapsed = time.monotonic() - start
    await client.close()
    return {
        "throughput": len(latencies) / elapsed,
        "p50_us": percentile(latencies, 0.5) * 1e6,
        "p99_us": percentile(latencies, 0.99) * 1e6,
        "requests": len(latencies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running Shoal serving this benchmark's repository (default: start one)")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--elements", default="256,65536", help="FP32 elements per request (65536 = 256 KiB: shm)")
    parser.add_argument("--seconds", type=float, default=4.0, help="measurement window per point")
    args = parser.parse_args()
    cluster_ctx = None
    url = args.url
    if url is None:
        from tests.cluster import running_cluster

        cluster_ctx = running_cluster(build_repository(Path(tempfile.mkdtemp(prefix="shoal-bench-ens-"))))
        url = cluster_ctx.__enter__().url
    rows = []
    try:
        for elements in (int(e) for e in args.elements.split(",")):
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                row = {"elements": elements, "concurrency": concurrency}
                for mode in ("ensemble", "client"):
                    row[mode] = asyncio.run(measure(url, mode, elements, concurrency, args.seconds))
                row["p50_ratio"] = row["ensemble"]["p50_us"] / row["client"]["p50_us"]
                row["throughput_ratio"] = row["ensemble"]["throughput"] / row["client"]["throughput"]
                rows.append(row)
                e, c = row["ensemble"], row["client"]
                print(
                    f"{elements:6d} floats c={concurrency:<2d} ensemble {e['throughput']:7.0f}/s p50 {e['p50_us']:7.0f}us"
                    f" p99 {e['p99_us']:7.0f}us | client chain {c['throughput']:7.0f}/s p50 {c['p50_us']:7.0f}us"
                    f" p99 {c['p99_us']:7.0f}us | p50 ratio {row['p50_ratio']:.2f}"
                    f" throughput ratio {row['throughput_ratio']:.2f}",
                    flush=True,
                )
    finally:
        if cluster_ctx is not None:
            cluster_ctx.__exit__(None, None, None)
    out_dir = ROOT / "bench-out"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"ensemble-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"cpus": os.cpu_count(), "results": rows}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

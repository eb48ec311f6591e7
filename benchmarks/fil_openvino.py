"""FIL and OpenVINO through Shoal at concurrency 16 with dynamic batching, against the same
library in this process at the same batch sizes, on one core each.

    python benchmarks/fil_openvino.py [--seconds 5] [--concurrency 16] [--out FILE.json]

Models, made here: an XGBoost binary classifier (300 trees of depth 8, 32 features,
predict_proba) served by FIL with XGBoost's own predictor and with treelite's
(`shoal.fil_predictor`), and the example MLP (256 -> 1024 -> 1024 -> 16) converted to OpenVINO
IR. Each is one instance with one compute thread (`cpu_nthread: 1`, `INFERENCE_NUM_THREADS: 1`),
`max_batch_size: 64`, dynamic batching. perf_analyzer (benchmarks/get_perf_analyzer.sh) sends
batch-1 requests at the given concurrency; the server's statistics give the mean batch the
dynamic batcher formed, and the same library then runs batches of that size back to back on one
thread in this process. Throughput is rows per second; the ratio is Shoal / in-process.
Run it under `flock /work/scratch/bench.lock` on a quiet machine; it prints the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench import perf_analyzer  # noqa: E402
from services.repository import examples  # noqa: E402
from tests.cluster import running_cluster  # noqa: E402

FEATURES = 32


def fil_config(name: str, predictor: str) -> str:
    return f"""
name: "{name}"
backend: "fil"
max_batch_size: 64
input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }} ]
output [ {{ name: "output__0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: 500 }}
parameters [ {{ key: "model_type" value: {{ string_value: "xgboost_ubj" }} }},
             {{ key: "is_classifier" value: {{ string_value: "true" }} }},
             {{ key: "predict_proba" value: {{ string_value: "true" }} }},
             {{ key: "cpu_nthread" value: {{ string_value: "1" }} }},
             {{ key: "shoal.fil_predictor" value: {{ string_value: "{predictor}" }} }} ]
"""


OV_CONFIG = """
name: "ov_mlp"
backend: "openvino"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
parameters [ { key: "INFERENCE_NUM_THREADS" value: { string_value: "1" } },
             { key: "NUM_STREAMS" value: { string_value: "1" } } ]
"""


def build(root: Path) -> dict:
    import openvino as ov
    import treelite
    import xgboost as xgb

    rng = np.random.default_rng(0)
    rows = rng.random((20_000, FEATURES), dtype=np.float32)
    labels = (rows[:, 0] + rows[:, 1] * rows[:, 2] > 0.7).astype(int)
    booster = xgb.train(
        {"objective": "binary:logistic", "max_depth": 8, "nthread": 2}, xgb.DMatrix(rows, label=labels), 300
    )
    for name, predictor in (("fil_xgboost", "library"), ("fil_treelite", "treelite")):
        (root / name / "1").mkdir(parents=True)
        booster.save_model(str(root / name / "1" / "xgboost.ubj"))
        (root / name / "config.pbtxt").write_text(fil_config(name, predictor))
    examples.write_examples(root / "onnx")
    (root / "ov_mlp" / "1").mkdir(parents=True)
    onnx_file = root / "onnx" / "mlp" / "1" / "model.onnx"
    ov.save_model(ov.convert_model(str(onnx_file)), str(root / "ov_mlp" / "1" / "model.xml"), compress_to_fp16=False)
    (root / "ov_mlp" / "config.pbtxt").write_text(OV_CONFIG)
    booster.set_param({"nthread": 1})
    tl_model = treelite.frontend.load_xgboost_model(
        str(root / "fil_xgboost" / "1" / "xgboost.ubj"), format_choice="ubjson"
    )
    compiled = ov.Core().compile_model(
        str(root / "ov_mlp" / "1" / "model.xml"),
        "CPU",
        {"INFERENCE_NUM_THREADS": "1", "NUM_STREAMS": "1", "INFERENCE_PRECISION_HINT": "f32"},
    )
    request = compiled.create_infer_request()
    return {
        "fil_xgboost": (lambda x: booster.inplace_predict(x), FEATURES),
        "fil_treelite": (lambda x: treelite.gtil.predict(tl_model, x, nthread=1), FEATURES),
        "ov_mlp": (lambda x: request.infer({"INPUT0": x}), 256),
    }


def in_process(predict, features: int, batch: int, seconds: float) -> float:
    """Rows per second of back-to-back batches of `batch` rows on this thread."""
    rows = np.random.default_rng(1).random((batch, features), dtype=np.float32)
    predict(rows)
    done, stop = 0, time.monotonic() + seconds
    while time.monotonic() < stop:
        predict(rows)
        done += batch
    return done / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    results = {"load_average_before": os.getloadavg(), "concurrency": args.concurrency}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        libraries = build(root)
        with running_cluster(root, worker={"intra_op_threads": 1}) as running:
            for model, (predict, features) in libraries.items():
                served = perf_analyzer(running.url, model, args.concurrency, args.seconds, stability=60)
                batch = max(1, round(served["avg_batch"]))
                local = in_process(predict, features, batch, args.seconds)
                results[model] = {
                    "shoal_rows_per_s": served["throughput"],
                    "p50_us": served["p50_us"],
                    "mean_batch": served["avg_batch"],
                    "in_process_rows_per_s": local,
                    "ratio": served["throughput"] / local,
                }
                print(
                    f"{model}: Shoal {served['throughput']:.0f} rows/s (mean batch {served['avg_batch']:.1f}, "
                    f"p50 {served['p50_us'] / 1000:.2f} ms), in-process {local:.0f} rows/s at batch {batch}: "
                    f"{served['throughput'] / local:.2f}x",
                    flush=True,
                )
    results["load_average_after"] = os.getloadavg()
    print(f"load average before {results['load_average_before']}, after {results['load_average_after']}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

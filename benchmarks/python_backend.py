"""Python-backend models through Shoal, measured in one run.

    python benchmarks/python_backend.py [--seconds 3] [--concurrency 1,8]

Serves the same add/sub computation three ways and loads each with perf_analyzer
(or the asyncio load generator without it), binary tensors over HTTP:
- `simple`: the ONNX model (onnxruntime backend), for reference;
- `py_add_sub`: a python-backend `model.py`, with `--python-isolation process` (a worker
  process per python model, the default) and again with `none` (in the worker's process);
- `bls_add_sub`: a python model that calls `simple` through BLS (two scheduler passes).
The baseline is the python model's `execute` called in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench import PERF_ANALYZER, asyncio_load, percentile, perf_analyzer  # noqa: E402

IO = """
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
dynamic_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

ADD_SUB = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return responses
"""

BLS = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = [pb_utils.InferenceRequest(model_name="simple", inputs=request.inputs(),
                                             requested_output_names=["OUTPUT0", "OUTPUT1"]).exec()
                   for request in requests]
        return [pb_utils.InferenceResponse(output_tensors=answer.output_tensors(), error=answer.error())
                for answer in answers]
"""


def write_repository(root: Path) -> Path:
    from services.repository.examples import SIMPLE_CONFIG, simple_graph, write_model

    write_model(root, "simple", simple_graph(), SIMPLE_CONFIG)
    for name, source in (("py_add_sub", ADD_SUB), ("bls_add_sub", BLS)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(textwrap.dedent(source))
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{IO}')
    return root


def in_process(root: Path, seconds: float) -> dict:
    """The python model's execute, called directly with one request at a time."""
    from services.worker.python.triton_api import pb_utils

    sys.modules.setdefault("triton_python_backend_utils", pb_utils)
    spec = importlib.util.spec_from_file_location("add_sub_model", root / "py_add_sub" / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    a = np.ones((1, 16), np.int32)
    latencies: list[float] = []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        t = time.perf_counter()
        request = pb_utils.InferenceRequest(inputs=[pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", a)])
        model.execute([request])
        latencies.append(time.perf_counter() - t)
    return {
        "throughput": len(latencies) / seconds,
        "p50_us": percentile(latencies, 0.5) * 1e6,
        "p99_us": percentile(latencies, 0.99) * 1e6,
    }


def measure(url: str, model: str, concurrency: int, seconds: float) -> dict:
    if PERF_ANALYZER.exists():
        return perf_analyzer(url, model, concurrency, seconds, stability=60)  # other work shares this machine
    inputs = {"INPUT0": np.ones((1, 16), np.int32), "INPUT1": np.ones((1, 16), np.int32)}
    return asyncio.run(asyncio_load(url, model, inputs, concurrency, seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", default="1,8")
    args = parser.parse_args()
    from tests.cluster import running_cluster

    root = write_repository(Path(tempfile.mkdtemp(prefix="shoal-pybench-")))
    levels = [int(c) for c in args.concurrency.split(",")]
    base = in_process(root, args.seconds)
    print(f"execute() in this process      {base['throughput']:8.0f}/s p50 {base['p50_us']:7.0f}us")
    for isolation in ("process", "none"):
        with running_cluster(root, worker={"python_isolation": isolation}) as running:
            models = ["simple", "py_add_sub", "bls_add_sub"] if isolation == "process" else ["py_add_sub"]
            for model in models:
                for concurrency in levels:
                    r = measure(running.url, model, concurrency, args.seconds)
                    print(
                        f"{model:11s} isolation={isolation:7s} c={concurrency:<2d} {r['throughput']:8.0f}/s "
                        f"p50 {r['p50_us']:7.0f}us p99 {r['p99_us']:7.0f}us",
                        flush=True,
                    )


if __name__ == "__main__":
    main()

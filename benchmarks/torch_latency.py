"""TorchScript through Shoal vs the same module in this process, at batch 1, sequential.

    python benchmarks/torch_latency.py [--requests 300]

The model is an MLP like the example `mlp` (FP32 256 -> 1024 -> 1024 -> 16), scripted and
served with Triton's INPUT__0/OUTPUT__0 names on one CPU instance. Prints p50/p99 in ms.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402

from tests.cluster import running_cluster  # noqa: E402

CONFIG = """
name: "torch_mlp"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 16),
    ).eval()


def percentiles(samples: list[float]) -> str:
    ms = np.array(samples) * 1000
    return f"p50 {np.percentile(ms, 50):.3f} ms, p99 {np.percentile(ms, 99):.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    x = np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "torch_mlp" / "1").mkdir(parents=True)
        scripted = torch.jit.script(mlp())
        scripted.save(str(root / "torch_mlp" / "1" / "model.pt"))
        (root / "torch_mlp" / "config.pbtxt").write_text(CONFIG)

        module = torch.jit.load(str(root / "torch_mlp" / "1" / "model.pt"))
        local = []
        with torch.inference_mode():
            for _ in range(args.requests + 20):
                start = time.perf_counter()
                expected = module(torch.from_numpy(x)).numpy()
                local.append(time.perf_counter() - start)
        print(f"in-process torch ({torch.get_num_threads()} threads): {percentiles(local[20:])}")

        with running_cluster(root) as running:
            client = httpclient.InferenceServerClient(running.url)
            tensor = httpclient.InferInput("INPUT__0", [1, 256], "FP32")
            tensor.set_data_from_numpy(x, binary_data=True)
            output = httpclient.InferRequestedOutput("OUTPUT__0", binary_data=True)
            remote = []
            for _ in range(args.requests + 20):
                start = time.perf_counter()
                result = client.infer("torch_mlp", [tensor], outputs=[output])
                remote.append(time.perf_counter() - start)
            np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), expected, rtol=1e-5, atol=1e-5)
            print(f"through Shoal (tritonclient.http, binary tensors): {percentiles(remote[20:])}")
            client.close()


if __name__ == "__main__":
    main()

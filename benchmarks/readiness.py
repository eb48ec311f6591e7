"""Ready means ready (issue 47, item 0; docs/reliability.md): start `shoal serve` N times on a
loaded machine and count the starts that answered `/v2/health/ready` 200 before every start-up
model was ready.

    python benchmarks/readiness.py --starts 50 --burners 4

Each start polls `/v2/health/ready` every few milliseconds from the moment the process starts;
at its first 200 it asks, at once, `/v2/models/<m>/ready` of every model of the repository and
gRPC's ServerReady, then runs one inference per model: a model not ready, gRPC saying otherwise,
or an inference failing then is a start that was ready too early. The repository holds python
models with an `auto_complete_config` (the repository runs each in a process of its own while
it reads the models: a repository slow to publish, as on a busy machine) sorted before and
between ONNX models. `--burners N` runs N CPU burners beside it (the load); the load average is
printed with the result.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402

from tests.integration.gated_models import write_onnx, write_python  # noqa: E402
from tests.serving import Serve  # noqa: E402

MODELS = ["a_python", "b_onnx", "c_python", "d_onnx", "e_onnx"]


def write_repository(root: Path) -> None:
    for name in MODELS:
        if name.endswith("python"):
            write_python(root, name)  # no gates: auto_complete_config and initialize return at once
        else:
            write_onnx(root, name)


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def one_start(workdir: Path, repo: Path, timeout: float) -> tuple[float, list[str]]:
    """Seconds to the first ready 200, and what was wrong then (empty: ready meant ready)."""
    serve = Serve(workdir, [f"--model-repository={repo}"])
    started = time.monotonic()
    serve.start(wait=False)
    base = f"http://{serve.url}"
    wrong: list[str] = []
    try:
        while status(f"{base}/v2/health/ready") != 200:
            assert serve.process is not None
            if serve.process.poll() is not None or time.monotonic() - started > timeout:
                return time.monotonic() - started, [f"never ready: {serve.log()[-2000:]}"]
            time.sleep(0.005)
        ready_after = time.monotonic() - started
        wrong += [f"{m} not ready" for m in MODELS if status(f"{base}/v2/models/{m}/ready") != 200]
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{serve.grpc_port}")
        try:
            if not grpc.is_server_ready():
                wrong.append("gRPC ServerReady false")
        finally:
            grpc.close()
        client = httpclient.InferenceServerClient(serve.url, network_timeout=60)
        try:
            for name in MODELS:
                tensor = httpclient.InferInput("INPUT0", [4], "FP32")
                tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
                try:
                    client.infer(name, [tensor])
                except Exception as exc:
                    wrong.append(f"{name}: {exc}")
        finally:
            client.close()
        serve.terminate(60)
        return ready_after, wrong
    finally:
        if serve.process is not None and serve.process.poll() is None:
            serve.kill_tree()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=50)
    parser.add_argument("--burners", type=int, default=0, help="CPU burners beside it (the load)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds a start may take to be ready")
    args = parser.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)]
    early, loads, times = 0, [], []
    try:
        with tempfile.TemporaryDirectory(prefix="shoal-readiness-") as tmp:
            repo = Path(tmp) / "models"
            write_repository(repo)
            for i in range(args.starts):
                ready_after, wrong = one_start(Path(tmp) / f"serve-{i}", repo, args.timeout)
                load = os.getloadavg()[0]
                loads.append(load)
                times.append(ready_after)
                early += bool(wrong)
                verdict = "ok" if not wrong else "EARLY: " + "; ".join(wrong)[:300]
                print(f"start {i + 1:3d}: ready after {ready_after:5.2f} s, load {load:4.1f}: {verdict}", flush=True)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    print(
        f"{early} of {args.starts} starts answered ready before their start-up models "
        f"(load average {min(loads):.1f}-{max(loads):.1f}, {os.cpu_count()} cores, {args.burners} burners; "
        f"ready after {min(times):.1f}-{max(times):.1f} s)"
    )
    sys.exit(1 if early else 0)


if __name__ == "__main__":
    main()

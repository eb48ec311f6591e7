"""Start and stop times of `shoal serve` on a repository of many small models.

Generates the repository of `tests/integration/many_models.py` (identity ONNX models of several
datatypes, a few ensembles and python models), runs `shoal serve` on it with its defaults, and
prints: seconds until /v2/health/ready, whether any worker was declared dead on the way, one
inference per model through tritonclient, and seconds from SIGTERM to exit.

    python -m benchmarks.many_models --models 200 [--model-load-thread-count 4]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np


def _drain(stream, lines: list[str]) -> None:
    for line in stream:
        lines.append(line)


def _infer(url: str, names: list[str]) -> int:
    import tritonclient.http as httpclient

    from tests.integration.many_models import DATATYPES

    client = httpclient.InferenceServerClient(url)
    served = 0
    for name in names:
        datatype = name.rsplit("_", 1)[1].upper() if name.startswith("m") else "FP32"
        if datatype not in DATATYPES:
            datatype = "FP32"
        array = (
            np.array([[b"a", b"b"]], dtype=object) if datatype == "BYTES" else np.ones((1, 2), dtype=_numpy(datatype))
        )
        tensor = httpclient.InferInput("INPUT0", list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        result = client.infer(name, [tensor])
        if np.array_equal(result.as_numpy("OUTPUT0"), array):
            served += 1
    return served


def _numpy(datatype: str) -> type:
    from tritonclient.utils import triton_to_np_dtype

    return triton_to_np_dtype(datatype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=200, help="identity ONNX models")
    parser.add_argument("--ensembles", type=int, default=4)
    parser.add_argument("--python-models", type=int, default=4)
    parser.add_argument("--model-load-thread-count", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()

    from shared.process.natsserver import free_port
    from tests.integration.many_models import write_many_models

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        names = write_many_models(root, args.models, args.ensembles, args.python_models)
        port, metrics = free_port(), free_port()
        command = [sys.executable, "-m", "shoal.cli", "serve", f"--model-repository={root}"]
        command += [f"--http-port={port}", f"--metrics-port={metrics}", "--http-address=127.0.0.1"]
        if args.model_load_thread_count is not None:
            command.append(f"--model-load-thread-count={args.model_load_thread_count}")
        started = time.monotonic()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        lines: list[str] = []
        threading.Thread(target=_drain, args=(process.stderr, lines), daemon=True).start()
        url = f"127.0.0.1:{port}"
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(url)
        ready_s = None
        try:
            while time.monotonic() - started < args.timeout and process.poll() is None:
                try:
                    if client.is_server_ready():
                        ready_s = time.monotonic() - started
                        break
                except Exception:
                    pass
                time.sleep(0.2)
            served = _infer(url, names) if ready_s is not None else 0
        finally:
            before_stop = len(lines)
            stopping = time.monotonic()
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
            stop_s = time.monotonic() - stopping
        # only lines logged before the stop count: a stopping worker stops beating on purpose
        dead = [line.strip() for line in lines[:before_stop] if "stopped sending heartbeats" in line]
        for line in dead:
            print(line, file=sys.stderr)
        print(
            json.dumps(
                {
                    "models": len(names),
                    "ready_s": None if ready_s is None else round(ready_s, 1),
                    "served": served,
                    "stop_s": round(stop_s, 1),
                    "workers_declared_dead": len(dead),
                    "cpus": os.cpu_count(),
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()

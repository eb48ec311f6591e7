"""Memory under model churn: N load/unload cycles of the MLP example on `shoal serve`
(explicit model control), printing each service's RSS as it goes (docs/reliability.md).

    python benchmarks/load_cycles.py --cycles 500 --max-seconds 300

A cycle loads `mlp`, runs one inference, and unloads it. The verdict compares each service's
RSS at the end with its RSS after the warm-up cycles (`--warmup`, default 20): within 5 %
is flat.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tritonclient.http as httpclient  # noqa: E402

from benchmarks.soak import rss_by_role  # noqa: E402
from services.repository import examples  # noqa: E402
from shared.process.natsserver import free_port  # noqa: E402
from tests.serving import Serve  # noqa: E402


def post(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, data=b"{}"), timeout=120):
        pass


def cycle(serve: Serve, client: httpclient.InferenceServerClient) -> None:
    post(f"http://{serve.url}/v2/repository/models/mlp/load")
    tensor = httpclient.InferInput("INPUT0", [4, 256], "FP32")
    tensor.set_data_from_numpy(np.ones((4, 256), np.float32))
    assert client.infer("mlp", [tensor]).as_numpy("OUTPUT0").shape == (4, 16)
    post(f"http://{serve.url}/v2/repository/models/mlp/unload")


def jetstream(serve: Serve) -> dict[str, int]:
    """nats-server's JetStream totals: what the control plane keeps (growth here is not Go's heap)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{serve.monitor_port}/jsz", timeout=5) as response:
            jsz = json.loads(response.read())
    except (OSError, ValueError):
        return {}
    found = {key: int(jsz.get(key, 0)) for key in ("streams", "consumers", "messages", "bytes")}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{serve.monitor_port}/varz", timeout=5) as response:
            varz = json.loads(response.read())
    except (OSError, ValueError):
        return found
    # the server's own view: its RSS, and the interest it keeps (a leak of subscriptions shows here)
    return {**found, "mem_kib": int(varz.get("mem", 0)) // 1024, "subscriptions": int(varz.get("subscriptions", 0))}


def run(cycles: int, max_seconds: float, warmup: int, every: int) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="shoal-cycles-"))
    examples.write_examples(workdir / "models")
    serve = Serve(
        workdir / "run",
        [f"--model-repository={workdir / 'models'}", "--model-control-mode=explicit", f"--grpc-port={free_port()}"],
    )
    samples: list[tuple[int, dict[str, int]]] = []
    try:
        serve.start()
        client = httpclient.InferenceServerClient(serve.url, network_timeout=120)
        samples.append((0, rss_by_role(serve)))
        began, done = time.monotonic(), 0
        while done < cycles and time.monotonic() - began < max_seconds:
            cycle(serve, client)
            done += 1
            if done % every == 0 or done == warmup:
                samples.append((done, rss_by_role(serve)))
                line = f"cycle {done:4d} {time.monotonic() - began:6.0f}s  {json.dumps(samples[-1][1])}"
                print(f"{line}  jetstream {json.dumps(jetstream(serve))}", flush=True)
        samples.append((done, rss_by_role(serve)))
        client.close()
        seconds = time.monotonic() - began
    finally:
        if serve.process is not None and serve.process.poll() is None:
            serve.terminate(60)
    base = next((rss for n, rss in samples if n >= warmup), samples[0][1])
    end = samples[-1][1]
    growth = {role: round(100 * (end.get(role, 0) - kib) / kib, 1) for role, kib in base.items() if kib}
    return {
        "cycles": done,
        "seconds": round(seconds, 1),
        "rss_kib_start": samples[0][1],
        "rss_kib_after_warmup": base,
        "rss_kib_end": end,
        "growth_percent_since_warmup": growth,
        "flat": all(abs(g) <= 5 for g in growth.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=500)
    parser.add_argument("--max-seconds", type=float, default=300)
    parser.add_argument("--warmup", type=int, default=20, help="cycles before the reference RSS is taken")
    parser.add_argument("--every", type=int, default=25, help="print RSS every this many cycles")
    args = parser.parse_args()
    print(json.dumps(run(args.cycles, args.max_seconds, args.warmup, args.every), indent=2))


if __name__ == "__main__":
    main()

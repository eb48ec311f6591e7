"""Decoupled-ensemble streaming: how fast iterations reach an SSE client.

    python benchmarks/bench_ensemble_stream.py --tokens 500 --blob 1,32768

Same server, one run, the repository of `tests/integration/stream_models.py`:

- `gen`: the decoupled generator alone over `/generate_stream` (the floor: one model's stream);
- `llm`: preprocess -> generator -> postprocess as an ensemble (two step requests per iteration
  on top: the postprocess and, once, the preprocess);
- `llm_one`: the same with `max_inflight_requests: 1` (one postprocess request at a time).

Prints time to first event and iterations per second for each, per `blob` (floats in the
per-iteration intermediate; 32768 = 128 KiB, through shared memory).
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def stream(url: str, model: str, body: dict) -> tuple[float, float, int]:
    """(seconds to the first event, seconds to the end, events)."""
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    start = time.perf_counter()
    conn.request("POST", f"/v2/models/{model}/generate_stream", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    first = 0.0
    count = 0
    buffer = b""
    while chunk := response.read1(65536):
        if not first:
            first = time.perf_counter() - start
        buffer += chunk
        *done, buffer = buffer.split(b"\n\n")
        count += sum(1 for event in done if event.startswith(b"data: "))
        if any(b'"error"' in event for event in done):
            raise RuntimeError(done)
    conn.close()
    return first, time.perf_counter() - start, count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--blob", default="1,32768")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from tests.cluster import running_cluster
    from tests.integration.stream_models import write_models

    root = Path(tempfile.mkdtemp(prefix="shoal-bench-stream-"))
    write_models(root)
    with running_cluster(root) as cluster:
        for blob in (int(b) for b in args.blob.split(",")):
            for model, key in (("gen", "PROMPT"), ("llm", "IN"), ("llm_one", "IN")):
                body = {key: list(range(args.tokens)), "blob": blob}
                stream(cluster.url, model, {key: [1], "blob": blob})  # warm
                best = min((stream(cluster.url, model, body) for _ in range(args.runs)), key=lambda r: r[1])
                first, total, count = best
                assert count == args.tokens, (model, count)
                print(
                    f"blob={blob:>6} {model:>8}: first event {first * 1000:7.1f} ms, "
                    f"{count / total:8.0f} iterations/s (best of {args.runs})",
                    flush=True,
                )


if __name__ == "__main__":
    main()

"""Overload (issue 47, item 3; docs/reliability.md, "Overload"): a model with a queue limit at
three times what the server can serve.

    python benchmarks/overload.py --seconds 10 --factor 3

The model (`overload`, python) takes `--execute-ms` per batch whatever its size (as a GPU would),
batches up to 4 and queues at most `--max-queue-size` requests (`dynamic_batching {
default_queue_policy { max_queue_size } }`). Phases:

1. capacity: as many closed-loop HTTP clients as the model can hold without refusing (batch +
   queue): requests/s and latency percentiles;
2. overload: an open loop at `--factor` times that rate (arrivals do not wait for answers):
   admitted requests' latency, refused requests' latency, status and text, each service's RSS;
3. recovery: the load stops; one client at a time until 10 requests in a row succeed within the
   capacity p99: the seconds that took; RSS again a few seconds later.
4. a client that stops reading: `--stream-seconds` of a decoupled model streaming large responses
   over gRPC to a client that never reads them: the gateway's RSS before, during and after.

Prints one JSON document; `--out FILE` writes it too. The load average is in it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from benchmarks.soak import rss_by_role  # noqa: E402
from tests.serving import Serve  # noqa: E402

MODEL = "overload"
STREAM_MODEL = "streamer"
MAX_BATCH = 4

MODEL_PY = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep({execute_s})  # a batch takes this long whatever its size, as on a GPU
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {max_batch}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{
  max_queue_delay_microseconds: 2000
  default_queue_policy {{ max_queue_size: {max_queue} }}
}}
"""

# decoupled: N responses of `size` floats each, as fast as it can send them
STREAM_PY = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.stream, args=(request,), daemon=True).start()
        return None

    def stream(self, request):
        count, size = (int(v) for v in pb_utils.get_input_tensor_by_name(request, "N").as_numpy())
        sender = request.get_response_sender()
        blob = np.ones(size, np.float32)
        for _ in range(count):
            if sender.is_cancelled():
                return
            sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("BLOB", blob)]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

STREAM_CONFIG = """
name: "streamer"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT64 dims: [ 2 ] } ]
output [ { name: "BLOB" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def write_repository(root: Path, execute_ms: float, max_queue: int) -> None:
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "1" / "model.py").write_text(textwrap.dedent(MODEL_PY.format(execute_s=execute_ms / 1000)))
    (root / MODEL / "config.pbtxt").write_text(CONFIG.format(name=MODEL, max_batch=MAX_BATCH, max_queue=max_queue))
    (root / STREAM_MODEL / "1").mkdir(parents=True)
    (root / STREAM_MODEL / "1" / "model.py").write_text(textwrap.dedent(STREAM_PY))
    (root / STREAM_MODEL / "config.pbtxt").write_text(STREAM_CONFIG)


BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]}
).encode()


async def one(session: aiohttp.ClientSession, url: str) -> tuple[float, int, str]:
    """(seconds, HTTP status, error text or "")."""
    started = time.monotonic()
    try:
        async with session.post(url, data=BODY, headers={"Content-Type": "application/json"}) as response:
            body = await response.read()
            status = response.status
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return time.monotonic() - started, 0, f"{type(exc).__name__}: {exc}"
    error = ""
    if status != 200:
        try:
            error = json.loads(body).get("error", "")
        except ValueError:
            error = body[:200].decode(errors="replace")
    return time.monotonic() - started, status, error


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ms = np.array(values) * 1000
    return {f"p{q}": round(float(np.percentile(ms, q)), 1) for q in (50, 90, 99)} | {"max": round(float(ms.max()), 1)}


async def closed_loop(url: str, clients: int, seconds: float) -> dict[str, Any]:
    results: list[tuple[float, int, str]] = []
    deadline = time.monotonic() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            results.append(await one(session, url))

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        started = time.monotonic()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        elapsed = time.monotonic() - started
    ok = [r[0] for r in results if r[1] == 200]
    return {
        "clients": clients,
        "requests": len(results),
        "ok": len(ok),
        "refused": len(results) - len(ok),
        "rate": round(len(ok) / elapsed, 1),
        "latency_ms": percentiles(ok),
    }


async def open_loop(url: str, rate: float, seconds: float, serve: Serve) -> dict[str, Any]:
    """`rate` arrivals a second for `seconds`, none waiting for an earlier answer."""
    results: list[tuple[float, int, str]] = []
    rss_peak: dict[str, int] = {}
    tasks: list[asyncio.Task] = []

    async def sample_rss() -> None:
        while True:
            for role, kib in rss_by_role(serve).items():
                rss_peak[role] = max(rss_peak.get(role, 0), kib)
            await asyncio.sleep(0.5)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def arrival() -> None:
            results.append(await one(session, url))

        sampler = asyncio.create_task(sample_rss())
        started = time.monotonic()
        sent = 0
        while (now := time.monotonic()) - started < seconds:
            due = int((now - started) * rate) + 1
            for _ in range(due - sent):
                tasks.append(asyncio.create_task(arrival()))
            sent = due
            await asyncio.sleep(0.002)
        offered = sent / (time.monotonic() - started)
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - started
        sampler.cancel()
    ok = [r[0] for r in results if r[1] == 200]
    refused = [r for r in results if r[1] != 200]
    texts: dict[str, int] = {}
    for _, status, error in refused:
        key = f"{status} {error}"
        texts[key] = texts.get(key, 0) + 1
    return {
        "offered_rate": round(offered, 1),
        "requests": len(results),
        "ok": len(ok),
        "served_rate": round(len(ok) / elapsed, 1),
        "refused": len(refused),
        "admitted_latency_ms": percentiles(ok),
        "refused_latency_ms": percentiles([r[0] for r in refused]),
        "refusals": texts,
        "rss_peak_kib": rss_peak,
    }


async def recovery(url: str, normal_s: float, timeout: float) -> float:
    """Seconds from now until 10 requests in a row succeed within `normal_s` each."""
    started = time.monotonic()
    streak = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        while streak < 10:
            if time.monotonic() - started > timeout:
                return float("inf")
            seconds, status, _ = await one(session, url)
            streak = streak + 1 if status == 200 and seconds <= normal_s else 0
    return time.monotonic() - started


def shm_kib() -> int:
    """What Shoal's tensors hold in /dev/shm (KiB): responses nobody has read yet live there."""
    total = 0
    for entry in os.scandir("/dev/shm"):
        if entry.name.startswith("shoal"):
            try:
                total += entry.stat().st_blocks * 512
            except OSError:
                pass
    return total // 1024


def stalled_stream(serve: Serve, seconds: float, count: int, size: int) -> dict[str, Any]:
    """A gRPC client asks the decoupled model for `count` responses of `size` floats and never
    reads one: the gateway's RSS before, at most during `seconds`, and after the client goes."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    before = rss_by_role(serve) | {"dev_shm": shm_kib()}
    channel = grpc.insecure_channel(f"127.0.0.1:{serve.grpc_port}")
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    request = service_pb2.ModelInferRequest(model_name=STREAM_MODEL)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "N", "INT64"
    tensor.shape.append(2)
    request.raw_input_contents.append(np.array([count, size], np.int64).tobytes())
    calls = stub.ModelStreamInfer(iter([request]))
    next(calls)  # the stream flows; then the client reads nothing more
    peak: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for role, kib in (rss_by_role(serve) | {"dev_shm": shm_kib()}).items():
            peak[role] = max(peak.get(role, 0), kib)
        time.sleep(0.5)
    calls.cancel()
    channel.close()
    time.sleep(3)  # what the gateway frees once the client is gone
    after = rss_by_role(serve) | {"dev_shm": shm_kib()}
    mib = count * size * 4 / 2**20
    return {"asked_mib": round(mib, 1), "rss_before_kib": before, "rss_peak_kib": peak, "rss_after_kib": after}


async def failed_stats(serve: Serve) -> tuple[int, int]:
    """The model's failed requests so far and their total time in the server (ns), as its
    statistics say: from the gateway's receipt to the refusal."""
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://{serve.url}/v2/models/{MODEL}/stats") as response:
            doc = await response.json()
    fail = doc["model_stats"][0]["inference_stats"]["fail"]
    return int(fail["count"]), int(fail["ns"])


async def measure(serve: Serve, args: argparse.Namespace) -> dict[str, Any]:
    url = f"http://{serve.url}/v2/models/{MODEL}/infer"
    await closed_loop(url, MAX_BATCH, 2)  # warm-up
    result: dict[str, Any] = {"rss_before_kib": rss_by_role(serve)}
    capacity = await closed_loop(url, MAX_BATCH + args.max_queue_size // 2, args.seconds)
    result["capacity"] = capacity
    rate = capacity["rate"] * args.factor
    failed_before = await failed_stats(serve)
    overload = await open_loop(url, rate, args.seconds, serve)
    failed_after = await failed_stats(serve)
    count = failed_after[0] - failed_before[0]
    # inside the server: the gateway's receipt to the refusal (the client's figure adds the
    # HTTP connection, its own event loop and the machine's queue for CPU)
    overload["refused_in_server_mean_ms"] = round((failed_after[1] - failed_before[1]) / max(count, 1) / 1e6, 2)
    result["overload"] = overload
    normal_s = capacity["latency_ms"]["p99"] / 1000
    result["back_to_normal_s"] = round(await recovery(url, normal_s, 60), 2)
    await asyncio.sleep(3)
    result["rss_after_kib"] = rss_by_role(serve)
    admitted = overload["admitted_latency_ms"]
    result["ratios"] = {
        "admitted_p99_vs_capacity_p99": round(admitted["p99"] / capacity["latency_ms"]["p99"], 2),
        "refused_p99_ms": overload["refused_latency_ms"].get("p99"),
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--factor", type=float, default=3.0, help="the overload: this many times capacity")
    parser.add_argument("--execute-ms", type=float, default=40.0, help="the model's time per batch")
    parser.add_argument("--max-queue-size", type=int, default=8)
    parser.add_argument("--stream-seconds", type=float, default=10.0, help="0: no stalled stream")
    parser.add_argument("--stream-count", type=int, default=2000)
    parser.add_argument("--stream-floats", type=int, default=256 * 1024, help="each response's size (floats)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-overload-") as tmp:
        repo = Path(tmp) / "models"
        write_repository(repo, args.execute_ms, args.max_queue_size)
        serve = Serve(Path(tmp) / "serve", [f"--model-repository={repo}"])
        serve.start()
        try:
            result = asyncio.run(measure(serve, args))
            if args.stream_seconds > 0:
                result["stalled_stream"] = stalled_stream(
                    serve, args.stream_seconds, args.stream_count, args.stream_floats
                )
            serve.terminate(60)
        finally:
            if serve.process is not None and serve.process.poll() is None:
                serve.kill_tree()
    result["load_average"] = [round(v, 1) for v in os.getloadavg()]
    result["settings"] = vars(args) | {"out": str(args.out) if args.out else None}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

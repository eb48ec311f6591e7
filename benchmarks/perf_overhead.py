"""`shoal perf`'s own cost: how many requests per second it can send to a server that answers at once.

    python benchmarks/perf_overhead.py [--concurrency 16] [--window-ms 2000] [--perf-analyzer PATH]

A stub KServe v2 server in a child process answers every inference at once with a fixed response (HTTP:
asyncio + httptools; gRPC: grpc.aio with tritonclient's service stubs), so the load generator is the
bottleneck. It prints shoal perf's requests/s over both protocols (and perf_analyzer's over HTTP on the
same stub when its binary is given or installed by benchmarks/get_perf_analyzer.sh) and the client CPU
time per request.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httptools
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.process.natsserver import free_port  # noqa: E402
from shoal.perf.options import PerfOptions  # noqa: E402
from shoal.perf.run import measure, run_loop  # noqa: E402

TENSOR = {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}
OUTPUT = {"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]}
ANSWERS = {
    "/v2/models/stub": {"name": "stub", "versions": ["1"], "platform": "stub", "inputs": [TENSOR], "outputs": [OUTPUT]},
    "/v2/models/stub/config": {
        "name": "stub",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
    },
    "/v2/models/stub/stats": {"model_stats": []},
    "/v2/health/ready": {},
    "/v2/health/live": {},
    "/v2": {"name": "stub", "version": "0", "extensions": []},
}
INFER_BODY = orjson.dumps(
    {"model_name": "stub", "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}]}
)


def _response(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


class StubProtocol(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_message_complete(self) -> None:
        path = self.url.decode()
        body = INFER_BODY if path.endswith("/infer") else orjson.dumps(ANSWERS.get(path, {}))
        self.transport.write(_response(body))  # type: ignore[attr-defined]


def grpc_servicer() -> tuple[object, Any]:
    from tritonclient.grpc import model_config_pb2, service_pb2_grpc
    from tritonclient.grpc import service_pb2 as pb

    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}
    metadata = pb.ModelMetadataResponse(
        name="stub", versions=["1"], platform="stub", inputs=[tensor], outputs=[{**tensor, "name": "OUTPUT0"}]
    )
    config = pb.ModelConfigResponse(config=model_config_pb2.ModelConfig(name="stub", max_batch_size=8))
    answer = pb.ModelInferResponse(model_name="stub", outputs=[{**tensor, "name": "OUTPUT0", "shape": [1, 16]}])
    answer.raw_output_contents.append(bytes(64))

    class Stub(service_pb2_grpc.GRPCInferenceServiceServicer):
        async def ModelMetadata(self, request, context):  # noqa: N802 (the service's method names)
            return metadata

        async def ModelConfig(self, request, context):  # noqa: N802
            return config

        async def ModelStatistics(self, request, context):  # noqa: N802
            return pb.ModelStatisticsResponse()

        async def ModelInfer(self, request, context):  # noqa: N802
            return answer

    return Stub(), service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server


def serve(port: int, grpc_port: int) -> None:
    import grpc

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(StubProtocol, "127.0.0.1", port)
        stub, add = grpc_servicer()
        rpc = grpc.aio.server()
        add(stub, rpc)
        rpc.add_insecure_port(f"127.0.0.1:{grpc_port}")
        await rpc.start()
        await server.serve_forever()

    asyncio.run(main())


def shoal_perf(url: str, concurrency: int, window_ms: int, protocol: str = "http") -> tuple[float, float]:
    options = PerfOptions(
        model="stub", url=url, protocol=protocol, concurrency=[concurrency], window_ms=window_ms, stability_pct=20
    )
    before = time.process_time()
    result = run_loop(measure(options))[0]
    cpu = time.process_time() - before
    # every window ran at about the reported rate (it is stable); the stub's stats are empty
    total_requests = result.client.throughput * result.windows * window_ms / 1e3
    return result.client.throughput, cpu / max(total_requests, 1) * 1e6


def perf_analyzer(binary: str, url: str, concurrency: int, window_ms: int) -> str:
    out = subprocess.run(
        [binary, "-m", "stub", "-u", url, "--concurrency-range", str(concurrency), "-p", str(window_ms), "-s", "20"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line.strip() for line in out.stdout.splitlines() if "Throughput:" in line]
    return lines[-1] if lines else f"perf_analyzer failed: {out.stdout[-300:]}{out.stderr[-300:]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--perf-analyzer", default=str(ROOT / "benchmarks" / ".tools" / "perf_analyzer"))
    args = parser.parse_args()
    port, grpc_port = free_port(), free_port()
    stub = multiprocessing.get_context("spawn").Process(target=serve, args=(port, grpc_port), daemon=True)
    stub.start()
    url = f"127.0.0.1:{port}"
    try:
        import urllib.request

        for _ in range(100):  # wait for the stub to listen (a condition, with a deadline of ~10 s)
            try:
                urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        for protocol, where in (("http", url), ("grpc", f"127.0.0.1:{grpc_port}")):
            throughput, cpu_us = shoal_perf(where, args.concurrency, args.window_ms, protocol)
            print(
                f"shoal perf -i {protocol} concurrency {args.concurrency}: {throughput:,.0f} requests/s, "
                f"{cpu_us:.0f} us CPU/request (one free core: ~{1e6 / cpu_us:,.0f} requests/s)"
            )
        if Path(args.perf_analyzer).exists():
            print(
                f"perf_analyzer concurrency {args.concurrency}: {perf_analyzer(args.perf_analyzer, url, args.concurrency, args.window_ms)}"
            )
    finally:
        stub.terminate()
        stub.join(5)


if __name__ == "__main__":
    main()

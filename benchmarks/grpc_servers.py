"""gRPC servers side by side: server CPU per call and calls per event-loop iteration.

    python benchmarks/grpc_servers.py                       # every server, 3 alternating rounds
    python benchmarks/grpc_servers.py --servers shoal,grpcio --calls 4000 --rounds 5
    python benchmarks/grpc_servers.py --serve shoal --port 50051   # one server alone (for callgrind)

Instructions per call (docs/grpc.md): run the server alone under
`valgrind --tool=callgrind python benchmarks/grpc_servers.py --serve KIND --port P --ready FILE`,
drive 200 calls (`--drive --port P --calls 200`), `callgrind_control -z <pid>`, drive 1,000 more,
`callgrind_control -d <pid>`, then SIGINT (the server exits cleanly): the dump's summary / 1,000.

Each server answers Triton's ModelInfer (and ModelStreamInfer) with a canned response from a
trivial servicer on uvloop, as the gateway's would after the core: what differs is the server
alone. A separate client process (grpc.aio, 3 channels as perf_analyzer opens at c=16) keeps
`--concurrency` calls in flight; the server process's CPU time (all its threads, /proc) is read
around a fixed number of calls after a warm-up. "calls/iteration" is how many handler calls
start in one loop iteration: calls that start together reach the dispatcher together and leave
in one bus message (docs/grpc.md). Servers, round after round, alternate so a busy machine
slows them alike.

- `shoal`: services/gateway/grpc/http2/http2_server.py (HTTP/2 on the event loop).
- `grpcio`: grpc.aio's server (generic handlers only, as the gateway registers them).
- `grpcio-thread`: grpcio's sync server (16 threads) handing calls to the loop in groups: one
  wake-up of the loop per group (`call_soon_threadsafe` only when the hand-off list was empty).
- `pygrpc-native`: `pygrpc_native.aio.server()` (PyPI; not a Shoal dependency: install it to
  measure it). Its bidirectional streams go to a grpcio fallback server, so only unary is native.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402
from tritonclient.grpc import service_pb2_grpc  # noqa: E402

SERVERS = ("shoal", "grpcio", "grpcio-thread", "pygrpc-native")
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


def request_bytes() -> bytes:
    """What perf_analyzer sends for `simple`: two INT32[1,16] raw inputs."""
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    return request.SerializeToString()


class Counting:
    """Handler calls per loop iteration: the first call of an iteration schedules the count's end."""

    def __init__(self) -> None:
        self.groups: list[int] = []
        self._current = 0

    def call(self) -> None:
        if self._current == 0:
            asyncio.get_running_loop().call_soon(self._end)
        self._current += 1

    def _end(self) -> None:
        self.groups.append(self._current)
        self._current = 0


class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, counting: Counting) -> None:
        self.counting = counting
        answer = pb.ModelInferResponse(model_name="simple", model_version="1", id="")
        for name in ("OUTPUT0", "OUTPUT1"):
            answer.outputs.add(name=name, datatype="INT32", shape=[1, 16])
            answer.raw_output_contents.append(bytes(64))
        self.answer = answer

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        self.counting.call()
        await asyncio.sleep(0)  # one hop through the loop, as the dispatcher's future
        return self.answer

    async def ModelStreamInfer(self, requests: Any, context: Any) -> Any:
        async for _ in requests:
            self.counting.call()
            await asyncio.sleep(0)
            yield pb.ModelStreamInferResponse(infer_response=self.answer)


class ThreadHandOff:
    """grpcio's sync server threads hand each call to the loop; the loop runs a group per wake-up."""

    def __init__(self, loop: asyncio.AbstractEventLoop, servicer: Servicer) -> None:
        self.loop = loop
        self.servicer = servicer
        self.lock = threading.Lock()
        self.waiting: list[tuple[Any, futures.Future[Any]]] = []

    def ModelInfer(self, request: Any, context: Any) -> Any:
        done: futures.Future[Any] = futures.Future()
        with self.lock:
            self.waiting.append((request, done))
            wake = len(self.waiting) == 1
        if wake:
            self.loop.call_soon_threadsafe(self._run)
        return done.result()

    def _run(self) -> None:
        with self.lock:
            group, self.waiting = self.waiting, []
        for request, done in group:
            task = self.loop.create_task(self.servicer.ModelInfer(request, None))
            task.add_done_callback(lambda t, d=done: d.set_result(t.result()))


async def serve(kind: str, port: int, ready: Path | None) -> None:
    counting = Counting()
    servicer = Servicer(counting)
    address = f"127.0.0.1:{port}"
    if kind == "shoal":
        from services.gateway.grpc.http2.http2_connection import KeepAlive
        from services.gateway.grpc.http2.http2_server import GrpcListener

        listener = GrpcListener(servicer, pb.DESCRIPTOR.services_by_name["GRPCInferenceService"], pb, KeepAlive())
        await listener.start("127.0.0.1", port)
    elif kind == "grpcio":
        from services.gateway.grpc.grpcio_server import GenericHandlersOnly

        server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, GenericHandlersOnly(server))
        server.add_insecure_port(address)
        await server.start()
    elif kind == "grpcio-thread":
        sync = grpc.server(futures.ThreadPoolExecutor(16))
        handler = grpc.unary_unary_rpc_method_handler(
            ThreadHandOff(asyncio.get_running_loop(), servicer).ModelInfer,
            request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=pb.ModelInferResponse.SerializeToString,
        )
        sync.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {"ModelInfer": handler})]
        )
        sync.add_insecure_port(address)
        sync.start()
    elif kind == "pygrpc-native":
        import pygrpc_native.aio

        native = pygrpc_native.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, native)
        native.add_insecure_port(address)
        await native.start()
    else:
        raise SystemExit(f"unknown server {kind}")
    if ready is not None:
        ready.write_text("ready")
    stop = asyncio.Event()  # SIGINT or SIGTERM: a normal exit, so that a profiler or callgrind writes its counts
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    while not stop.is_set():  # the groups seen so far, for the driver to read
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
        if ready is not None and counting.groups:
            ready.with_suffix(".groups").write_text(f"{len(counting.groups)} {sum(counting.groups)}")


async def drive(port: int, calls: int, concurrency: int, streaming: bool) -> None:
    payload = request_bytes()
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(3)]
    left = calls

    async def unary(channel: grpc.aio.Channel) -> None:
        nonlocal left
        call = channel.unary_unary(INFER, request_serializer=None, response_deserializer=None)
        while left > 0:
            left -= 1
            await call(payload, timeout=30)

    async def stream(channel: grpc.aio.Channel) -> None:
        nonlocal left
        call = channel.stream_stream(STREAM, request_serializer=None, response_deserializer=None)()
        while left > 0:
            left -= 1
            await call.write(payload)
            await call.read()
        await call.done_writing()

    worker = stream if streaming else unary
    await asyncio.gather(*(worker(channels[i % 3]) for i in range(concurrency)))
    for channel in channels:
        await channel.close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def groups(path: Path) -> tuple[int, int]:
    try:
        count, total = path.read_text().split()
        return int(count), int(total)
    except (OSError, ValueError):
        return 0, 0


def one(kind: str, calls: int, warmup: int, concurrency: int, streaming: bool, tmp: Path) -> tuple[float, float]:
    """(server CPU µs per call, calls per loop iteration) for one server."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = tmp / f"{kind}-{port}.ready"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, __file__, "--serve", kind, "--port", str(port), "--ready", str(ready)]
    server = subprocess.Popen(cmd, env=env)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit(f"{kind} did not start")
            time.sleep(0.05)
        client = [sys.executable, __file__, "--drive", "--port", str(port), "--concurrency", str(concurrency)]
        client += ["--stream"] if streaming else []
        subprocess.run([*client, "--calls", str(warmup)], check=True, env=env, timeout=600)
        time.sleep(0.6)  # the server writes its group counts every 0.5 s
        before_cpu, before_groups = cpu_seconds(server.pid), groups(ready.with_suffix(".groups"))
        subprocess.run([*client, "--calls", str(calls)], check=True, env=env, timeout=600)
        after_cpu = cpu_seconds(server.pid)
        time.sleep(0.6)
        after_groups = groups(ready.with_suffix(".groups"))
        iterations = after_groups[0] - before_groups[0]
        per_iteration = (after_groups[1] - before_groups[1]) / iterations if iterations else float("nan")
        return (after_cpu - before_cpu) / calls * 1e6, per_iteration
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default=",".join(SERVERS))
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--stream", action="store_true", help="ModelStreamInfer: one stream per concurrent caller")
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ready", type=Path)
    args = p.parse_args()
    import uvloop

    if args.serve:
        uvloop.run(serve(args.serve, args.port, args.ready))
        return
    if args.drive:
        uvloop.run(drive(args.port, args.calls, args.concurrency, args.stream))
        return
    import tempfile

    kinds = args.servers.split(",")
    if args.stream and "grpcio-thread" in kinds:  # its hand-off is written for unary calls only
        kinds.remove("grpcio-thread")
    results: dict[str, list[tuple[float, float]]] = {kind: [] for kind in kinds}
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for kind in kinds:
                cpu, grouped = one(kind, args.calls, args.warmup, args.concurrency, args.stream, Path(tmp))
                results[kind].append((cpu, grouped))
                print(
                    f"round {round_ + 1} {kind}: {cpu:.0f} µs CPU per call, {grouped:.2f} calls/iteration", flush=True
                )
    print(f"load average after: {os.getloadavg()}")
    print("| server | server CPU µs per call (median; runs) | calls per loop iteration (median) |")
    print("|---|---|---|")
    for kind, runs in results.items():
        cpus = [round(c) for c, _ in runs]
        print(
            f"| {kind} | {statistics.median(cpus):.0f} ({', '.join(map(str, cpus))}) "
            f"| {statistics.median(g for _, g in runs):.2f} |"
        )


if __name__ == "__main__":
    main()

"""The resource soak's load (benchmarks/soak_resources.py): one thread per kind of request, each
paced at a rate, each with its own official tritonclient client; a kind's `once` raises on a
failed or wrong answer."""

from __future__ import annotations

import itertools
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

TIMEOUT_S = 30.0
FRESH_EVERY = 100  # the JSON client and the stream are opened again after this many requests
STREAM_COUNT = 4  # responses per decoupled request
SEQUENCE = (3, 1, 4, 1)  # one sequence's values: the last answer is their sum
SHM_PREFIX = "soak_client_"  # the load's own /dev/shm regions


@dataclass
class Failure:
    kind: str
    model: str
    started: float
    ended: float
    error: str


@dataclass
class Tally:
    """One kind's outcomes; only its own thread writes it."""

    kind: str
    model: str
    ok: int = 0
    failures: list[Failure] = field(default_factory=list)


def describe(exc: Exception) -> str:
    """'<status> <message>' of a tritonclient error ('<type> <text>' for anything else)."""
    status = exc.status() if hasattr(exc, "status") else ""
    message = exc.message() if hasattr(exc, "message") else str(exc)
    return f"{status or type(exc).__name__} {message or ''}"[:200]


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"wrong answer: {what}")


def http(url: str, concurrency: int = 1) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(
        url, concurrency=concurrency, network_timeout=TIMEOUT_S, connection_timeout=TIMEOUT_S
    )


def grpc(url: str) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(url)


def tensor(module: Any, name: str, value: np.ndarray, datatype: str, binary: bool = True) -> Any:
    made = module.InferInput(name, list(value.shape), datatype)
    if module is httpclient:
        made.set_data_from_numpy(value, binary_data=binary)
    else:
        made.set_data_from_numpy(value)
    return made


class HttpJson:
    """`simple` (onnxruntime) over HTTP in JSON, a new connection every FRESH_EVERY requests."""

    model = "simple"

    def __init__(self, http_url: str, grpc_url: str) -> None:
        self.url, self.count, self.client = http_url, 0, http(http_url)

    def once(self) -> None:
        self.count += 1
        if self.count % FRESH_EVERY == 0:
            self.client.close()
            self.client = http(self.url)
        a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.ones((1, 16), np.int32)
        inputs = [tensor(httpclient, "INPUT0", a, "INT32", False), tensor(httpclient, "INPUT1", b, "INT32", False)]
        outputs = [httpclient.InferRequestedOutput(n, binary_data=False) for n in ("OUTPUT0", "OUTPUT1")]
        result = self.client.infer(self.model, inputs, outputs=outputs)
        expect(np.array_equal(result.as_numpy("OUTPUT0"), a + b), "simple OUTPUT0")

    def close(self) -> None:
        self.client.close()


class HttpBinary:
    """`mlp` (onnxruntime, dynamic batching) over HTTP with binary tensors."""

    model = "mlp"

    def __init__(self, http_url: str, grpc_url: str) -> None:
        self.client = http(http_url)

    def once(self) -> None:
        value = np.full((1, 256), 0.5, np.float32)
        result = self.client.infer(self.model, [tensor(httpclient, "INPUT0", value, "FP32")])
        expect(result.as_numpy("OUTPUT0").shape == (1, 16), "mlp OUTPUT0 shape")

    def close(self) -> None:
        self.client.close()


class HttpBatch:
    """Four requests at once to `identity_fp32` (dynamic batching): the batcher merges them."""

    model = "identity_fp32"

    def __init__(self, http_url: str, grpc_url: str) -> None:
        self.client = http(http_url, concurrency=4)

    def once(self) -> None:
        values = [np.full((1, 8), i, np.float32) for i in range(4)]
        pending = [self.client.async_infer(self.model, [tensor(httpclient, "INPUT0", v, "FP32")]) for v in values]
        for value, request in zip(values, pending):
            expect(np.array_equal(request.get_result().as_numpy("OUTPUT0"), value), "identity_fp32 OUTPUT0")

    def close(self) -> None:
        self.client.close()


class GrpcPython:
    """`py_double` (python backend, dynamic batching) over gRPC."""

    model = "py_double"

    def __init__(self, http_url: str, grpc_url: str) -> None:
        self.client = grpc(grpc_url)

    def once(self) -> None:
        value = np.arange(4, dtype=np.float32).reshape(1, 4)
        result = self.client.infer(self.model, [tensor(grpcclient, "X", value, "FP32")], client_timeout=TIMEOUT_S)
        expect(np.array_equal(result.as_numpy("Y"), value * 2), "py_double Y")

    def close(self) -> None:
        self.client.close()


class GrpcEnsemble:
    """`ensemble` (py_double, then identity_fp32 on onnxruntime) over gRPC."""

    model = "ensemble"

    def __init__(self, http_url: str, grpc_url: str) -> None:
        self.client = grpc(grpc_url)

    def once(self) -> None:
        value = np.arange(6, dtype=np.float32).reshape(1, 6)
        result = self.client.infer(self.model, [tensor(grpcclient, "RAW", value, "FP32")], client_timeout=TIMEOUT_S)
        expect(np.array_equal(result.as_numpy("OUT"), value * 2), "ensemble OUT")

    def close(self) -> None:
        self.client.close()


class HttpSequence:
    """A whole sequence of `accumulate` (python, sequence batcher) over HTTP, a new id each time."""

    model = "accumulate"

    def __init__(self, http_url: str, grpc_url: str) -> None:
        self.client, self.ids = http(http_url), itertools.count(1)

    def once(self) -> None:
        sequence_id, last = next(self.ids), len(SEQUENCE) - 1
        for i, value in enumerate(SEQUENCE):
            inputs = [tensor(httpclient, "INPUT", np.array([[value]], np.int32), "INT32")]
            result = self.client.infer(
                self.model, inputs, sequence_id=sequence_id, sequence_start=i == 0, sequence_end=i == last
            )
        expect(int(result.as_numpy("OUTPUT").reshape(-1)[0]) == sum(SEQUENCE), "accumulate OUTPUT")

    def close(self) -> None:
        self.client.close()


class GrpcStream:
    """A decoupled request to `streamer` on a gRPC stream (opened again every FRESH_EVERY requests):
    STREAM_COUNT responses, then the empty final one."""

    model = "streamer"

    def __init__(self, http_url: str, grpc_url: str) -> None:
        self.url, self.count, self.client = grpc_url, 0, grpc(grpc_url)
        self.answers = self.open()

    def once(self) -> None:
        self.count += 1
        if self.count % FRESH_EVERY == 0:
            self.reopen()
        inputs = [tensor(grpcclient, "N", np.array([STREAM_COUNT], np.int32), "INT32")]
        self.client.async_stream_infer(self.model, inputs, enable_empty_final_response=True)
        got = []
        while True:
            result, error = self.answers.get(timeout=TIMEOUT_S)
            if error is not None:
                self.reopen()  # what was left of this request on the old stream does not reach the next
                raise error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            got.append(int(result.as_numpy("OUT")[0]))
        expect(got == list(range(STREAM_COUNT)), f"streamer answers {got}")

    def open(self) -> queue.Queue[tuple[Any, Any]]:
        """A new stream, its answers in a queue of their own (a late one of the last never mixes in)."""
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: answers.put((result, error)))
        return answers

    def reopen(self) -> None:
        self.client.stop_stream()
        self.answers = self.open()

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


class SharedMemory:
    """Client system shared memory, HTTP and gRPC in turn: create a region, register it, `simple`
    with its inputs and outputs in it, unregister, destroy."""

    model = "simple"

    def __init__(self, http_url: str, grpc_url: str) -> None:
        self.clients = itertools.cycle([http(http_url), grpc(grpc_url)])

    def once(self) -> None:
        client = next(self.clients)
        module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
        key = f"{SHM_PREFIX}{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(key, f"/{key}", 256)
        try:
            self.infer(client, module, key, handle)
        finally:
            shm.destroy_shared_memory_region(handle)

    def infer(self, client: Any, module: Any, key: str, handle: Any) -> None:
        a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 2, np.int32)
        shm.set_shared_memory_region(handle, [a, b])
        client.register_system_shared_memory(key, f"/{key}", 256)
        try:
            inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            outputs = [module.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
            for i, item in enumerate([*inputs, *outputs]):
                item.set_shared_memory(key, 64, offset=64 * i)
            client.infer(self.model, inputs, outputs=outputs)
        finally:
            client.unregister_system_shared_memory(key)
        expect(np.array_equal(shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=128), a + b), "shm OUTPUT0")

    def close(self) -> None:
        for _ in range(2):
            next(self.clients).close()


KINDS: dict[str, Any] = {  # name: a driver class (its `model`, its `once`)
    "http json simple": HttpJson,
    "http binary mlp": HttpBinary,
    "http batch identity": HttpBatch,
    "grpc python": GrpcPython,
    "grpc ensemble": GrpcEnsemble,
    "http sequence": HttpSequence,
    "grpc decoupled stream": GrpcStream,
    "shm register/infer/unregister": SharedMemory,
}


def drive(make: Any, urls: tuple[str, str], rate: float, stop: threading.Event, tally: Tally) -> None:
    """A driver made here (tritonclient.http's gevent pool belongs to the thread that makes it),
    then its `once()` `rate` times a second until `stop` (no catching up after a slow one)."""
    driver = make(*urls)
    period, due = 1.0 / rate, time.monotonic()
    try:
        while not stop.is_set():
            started = time.monotonic()
            try:
                driver.once()
                tally.ok += 1
            except Exception as exc:  # a tritonclient error, a wrong answer, the connection itself
                tally.failures.append(Failure(tally.kind, tally.model, started, time.monotonic(), describe(exc)))
            due = max(due + period, time.monotonic())
            stop.wait(due - time.monotonic())
    finally:
        driver.close()


def start(
    http_url: str, grpc_url: str, rate: float, stop: threading.Event
) -> tuple[list[Tally], list[threading.Thread]]:
    """A paced thread for every kind of KINDS, each with its tally."""
    tallies, threads = [], []
    for name, make in KINDS.items():
        tally = Tally(name, make.model)
        args = (make, (http_url, grpc_url), rate, stop, tally)
        threads.append(threading.Thread(target=drive, args=args, name=name, daemon=True))
        tallies.append(tally)
        threads[-1].start()
    return tallies, threads

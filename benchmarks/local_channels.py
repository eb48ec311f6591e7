#!/usr/bin/env python3
"""How a batch should reach a worker on the same host (issue 43): NATS as Shoal uses it today against
a Unix socket and a shared-memory ring, measured between two asyncio processes.

usage: python benchmarks/local_channels.py [--seconds 3] [--repeats 3] [--sizes 200,4096,65536]
           [--concurrency 1,16] [--channels nats,unix,unix-4mib,streams,shm-eventfd,shm-pipe] [--loop uvloop]
           [--json PATH]

This process is the gateway side; it starts a nats-server and a worker process. Both run the event
loop Shoal's services run (uvloop, shared/process/runtime.py). The gateway keeps `c` batches in
flight, each a frame of the given size (an `ExecBatch` of `simple` is 100-300 bytes; 64 KiB is the
largest tensor that travels inline); the worker answers each with a frame of the same size (its
`BatchDone`). The channels:

- nats: what Shoal does today (shared/bus/): the gateway publishes with a reply subject, the worker's
  subscription (`subscribe_now`) answers with `publish_now`, the gateway's inbox (`hot_path.subscribe`)
  completes the batch; through a real nats-server;
- unix: a Unix-domain stream socket, 4-byte length-prefixed frames, an `asyncio.Protocol` on each side;
- unix-4mib: the same with SO_SNDBUF and SO_RCVBUF of 4 MiB (the default, 208 KiB, holds three
  64 KiB frames: at c=16 the rest wait in the transport's buffer and go in many small writes);
- streams: the same socket through asyncio streams (`StreamReader.readexactly`);
- shm-eventfd: a shared-memory ring per direction (an mmap of a file in /dev/shm) and an eventfd per
  direction as the doorbell, read with `loop.add_reader`: the shape of Triton's python backend and its
  stub (a shared-memory queue per direction; Triton wakes the other side with a futex, and an event
  loop can wait only on a file descriptor);
- shm-pipe: the same rings with a pipe as the doorbell (a pipe, unlike an eventfd, ends when its
  writer dies).

Each case is warmed up, then run for `--seconds`; the cases of one size and concurrency are
interleaved (A, B, C, A, B, C) so that the machine's load drifts across all of them alike. Per run:
p50/p99 round trip, round trips per second and CPU µs per round trip of each process
(`time.process_time` on both sides, nats-server's from /proc), with the load average beside it. At
the end the worker is killed (SIGKILL) and each channel says how soon the gateway noticed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import mmap
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol, cast

from shared.bus import connection, eager, hot_path
from shared.bus.hot_path import Outgoing
from shared.process.natsserver import NatsServer

CHANNELS = ("nats", "unix", "unix-4mib", "streams", "shm-eventfd", "shm-pipe")
BATCH_SUBJECT = "bench.worker.batch"  # the worker's batch subject (ExecBatch)
INBOX = "bench.gateway.inbox"  # the gateway's inbox (BatchDone)
UNDELIVERED = "bench.worker.undelivered"  # the worker's reply subject on BatchDone, as completions.py sets

_LENGTH = struct.Struct(">I")  # a frame's length prefix on the socket and in the ring
_KEY = struct.Struct("<I")  # the first bytes of every frame: which in-flight slot it answers


SOCKET_BUFFER = 4 << 20  # unix-4mib's SO_SNDBUF and SO_RCVBUF: 16 frames of 64 KiB fit (the default is 208 KiB)
RING_CAPACITY = 4 << 20  # bytes of frames per direction: 16 in flight of 64 KiB fit four times over
RING_HEADER = 128  # head (written by the producer) and tail (by the consumer) on their own cache lines
RING_BYTES = RING_HEADER + RING_CAPACITY
RING_PAIRS = ("shm-eventfd", "shm-pipe")  # a pair of rings each: a ring's head and tail are one end's state

OnFrame = Callable[[bytes], None]


# -- the shared-memory ring -----------------------------------------------------------------------
class Ring:
    """One direction of a shared mapping: one producer process, one consumer process.

    `head` and `tail` count bytes ever written and read, so full and empty never look alike. Records
    are 8-byte aligned (a 4-byte length, then the frame) and the capacity is a multiple of 8, so a
    length never straddles the end; a frame may, and is copied in two parts. The producer writes the
    frame before the head: x86 keeps stores in order, and the doorbell's system call after them is a
    full barrier."""

    def __init__(self, mapping: mmap.mmap, offset: int) -> None:
        self._map = mapping
        # head and tail through a memoryview of 8-byte words: one aligned store each, which the other
        # process never sees half-done. Not struct.pack_into: it zeroes the field before it writes it,
        # and the other side read that zero (a torn head: garbage frames; a torn tail: "ring full")
        self._words = memoryview(mapping).cast("Q")
        self._head_at, self._tail_at = offset // 8, (offset + 64) // 8
        self._data = offset + RING_HEADER
        self._head = self._words[self._head_at]  # ours, when we produce
        self._tail = self._words[self._tail_at]  # ours, when we consume

    def put(self, frame: bytes) -> None:
        size = len(frame)
        record = (4 + size + 7) & ~7
        if self._head + record - self._words[self._tail_at] > RING_CAPACITY:
            raise BufferError("ring full")  # the benchmark never fills it: see RING_CAPACITY
        at = self._head % RING_CAPACITY
        _LENGTH.pack_into(self._map, self._data + at, size)  # not yet published: a plain write will do
        self._copy_in(at + 4, memoryview(frame))
        self._head += record
        self._words[self._head_at] = self._head

    def _copy_in(self, at: int, frame: memoryview) -> None:
        first = min(len(frame), RING_CAPACITY - at)
        self._map[self._data + at : self._data + at + first] = frame[:first]
        if first < len(frame):
            self._map[self._data : self._data + len(frame) - first] = frame[first:]

    def get(self) -> bytes | None:
        if self._tail == self._words[self._head_at]:
            return None
        at = self._tail % RING_CAPACITY
        size = _LENGTH.unpack_from(self._map, self._data + at)[0]
        frame = self._copy_out(at + 4, size)
        self._tail += (4 + size + 7) & ~7
        self._words[self._tail_at] = self._tail
        return frame

    def _copy_out(self, at: int, size: int) -> bytes:
        first = min(size, RING_CAPACITY - at)
        frame = self._map[self._data + at : self._data + at + first]
        if first < size:
            frame += self._map[self._data : self._data + size - first]
        return frame


class Doorbell(Protocol):
    def ring(self) -> None: ...

    def clear(self) -> bool:
        """Take the wake-ups; False when the other side has gone (a pipe's EOF)."""
        ...

    @property
    def fd(self) -> int: ...


class EventfdBell:
    """An eventfd shared by both processes: a write adds, one read takes every wake-up so far."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def ring(self) -> None:
        os.eventfd_write(self.fd, 1)

    def clear(self) -> bool:
        with contextlib.suppress(BlockingIOError):  # woken, but another read took it
            os.eventfd_read(self.fd)
        return True  # an eventfd never says that its other user died


class PipeBell:
    """A pipe per direction: a byte per frame, read in bulk; EOF once the writer's process is gone."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.fd, self._write_fd = read_fd, write_fd

    def ring(self) -> None:
        with contextlib.suppress(BlockingIOError):  # full: the reader has 64 KiB of wake-ups pending
            os.write(self._write_fd, b"\0")

    def clear(self) -> bool:
        try:
            return os.read(self.fd, 4096) != b""
        except BlockingIOError:
            return True


class RingEnd:
    """One process's end of a ring pair: sends on one ring, reads the other when its doorbell rings."""

    def __init__(self, send: Ring, receive: Ring, out_bell: Doorbell, in_bell: Doorbell) -> None:
        self._send, self._receive = send, receive
        self._out, self._in = out_bell, in_bell
        self.on_frame: OnFrame = _nothing
        self.on_gone: Callable[[], None] = _nothing_more

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.add_reader(self._in.fd, self._woken)

    def stop(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.remove_reader(self._in.fd)

    def write(self, frame: bytes) -> None:
        self._send.put(frame)
        self._out.ring()

    def _woken(self) -> None:
        alive = self._in.clear()  # before reading: a frame put after this read rings again
        while (frame := self._receive.get()) is not None:
            self.on_frame(frame)
        if not alive:
            asyncio.get_running_loop().remove_reader(self._in.fd)
            self.on_gone()


def _nothing(frame: bytes) -> None:
    pass


def _nothing_more() -> None:
    pass


def map_rings(path: str) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, 2 * RING_BYTES * len(RING_PAIRS))
    finally:
        os.close(fd)


def ring_pair(mapping: mmap.mmap, channel: str) -> tuple[Ring, Ring]:
    """The channel's rings: to the worker, to the gateway."""
    at = RING_PAIRS.index(channel) * 2 * RING_BYTES
    return Ring(mapping, at), Ring(mapping, at + RING_BYTES)


def make_ring_file() -> str:
    fd, path = tempfile.mkstemp(prefix="shoal-bench-ring-", dir="/dev/shm")  # 0600
    os.ftruncate(fd, 2 * RING_BYTES * len(RING_PAIRS))
    os.close(fd)
    return path


# -- the Unix socket: length-prefixed frames ------------------------------------------------------
class FrameProtocol(asyncio.Protocol):
    """Frames out of a byte stream: parsed straight from what was read when it holds whole frames
    (the common case), through a buffer when a frame is split across reads."""

    def __init__(self, on_frame: OnFrame, on_gone: Callable[[], None] = _nothing_more, buffer: int = 0) -> None:
        self._on_frame, self._on_gone, self._socket_buffer = on_frame, on_gone, buffer
        self._buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is one, without the base class
        if self._socket_buffer:  # capped by net.core.wmem_max / rmem_max
            sock = self.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._socket_buffer)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._socket_buffer)

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_gone()

    def data_received(self, data: bytes) -> None:
        if not self._buffer:
            used = self._parse(data)
            if used < len(data):
                self._buffer += memoryview(data)[used:]
            return
        self._buffer += data
        used = self._parse(self._buffer)
        del self._buffer[:used]

    def _parse(self, data: bytes | bytearray) -> int:
        at, end = 0, len(data)
        with memoryview(data) as view:  # one copy per frame, out of bytes or the buffer alike
            while end - at >= 4:
                stop = at + 4 + _LENGTH.unpack_from(view, at)[0]
                if stop > end:
                    break
                self._on_frame(bytes(view[at + 4 : stop]))
                at = stop
        return at

    def write(self, frame: bytes) -> None:
        assert self.transport is not None
        self.transport.writelines((_LENGTH.pack(len(frame)), frame))


# -- the worker side ------------------------------------------------------------------------------
@dataclass
class WorkerArgs:
    nats_url: str
    socket_dir: str
    ring_path: str
    eventfds: tuple[int, int]  # to the worker, to the gateway
    pipes: tuple[int, int]  # the worker's read end (to the worker), its write end (to the gateway)


async def worker_main(args: WorkerArgs) -> None:
    """Answer every frame on every channel with one of the same size, until stdin closes."""
    loop = asyncio.get_running_loop()
    nc = await _worker_nats(args.nats_url)
    unix = await loop.create_unix_server(EchoProtocol, socket_path(args.socket_dir, "unix"))
    big = await loop.create_unix_server(lambda: EchoProtocol(SOCKET_BUFFER), socket_path(args.socket_dir, "unix-4mib"))
    streams = await asyncio.start_unix_server(_echo_stream, socket_path(args.socket_dir, "streams"))
    mapping = map_rings(args.ring_path)
    pipe = PipeBell(args.pipes[0], args.pipes[1])
    bells: dict[str, tuple[Doorbell, Doorbell]] = {  # out, in
        "shm-eventfd": (EventfdBell(args.eventfds[1]), EventfdBell(args.eventfds[0])),
        "shm-pipe": (pipe, pipe),
    }
    for channel, (out_bell, in_bell) in bells.items():
        to_worker, to_gateway = ring_pair(mapping, channel)
        end = RingEnd(to_gateway, to_worker, out_bell, in_bell)
        end.on_frame = end.write
        end.start(loop)
    await _serve_control()
    for server in (unix, big, streams):
        server.close()
    await nc.close()


async def _worker_nats(url: str) -> Any:
    """Shoal's worker: its batch subscription answers as it reads (services/worker/service.py and
    batches/batch_executor.py), the answer carrying a reply subject of the worker's own."""
    nc = await connection.connect(url, "bench-worker")

    def on_batch(msg: Any) -> None:
        answer = [Outgoing(msg.reply, msg.data, f"{UNDELIVERED}.1")]
        if not hot_path.publish_now(nc, answer):
            eager.start(hot_path.publish_all(nc, answer))

    async def undelivered(msg: Any) -> None:
        pass

    await hot_path.subscribe_now(nc, BATCH_SUBJECT, on_batch)
    await nc.subscribe(f"{UNDELIVERED}.*", cb=undelivered)
    await connection.settled(nc)
    return nc


class EchoProtocol(FrameProtocol):
    """The worker's end of the socket: every frame answered with itself."""

    def __init__(self, buffer: int = 0) -> None:
        super().__init__(self.write, buffer=buffer)


async def _echo_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
        while True:
            frame = await reader.readexactly(_LENGTH.unpack(await reader.readexactly(4))[0])
            writer.writelines((_LENGTH.pack(len(frame)), frame))
    writer.close()


async def _serve_control() -> None:
    """The gateway's questions on stdin, one a line: `cpu` is answered with this process's CPU
    seconds on stdout. Ends with stdin."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    pending = bytearray()

    def readable() -> None:
        chunk = os.read(0, 4096)
        if not chunk:
            loop.remove_reader(0)
            ended.set_result(None)
            return
        pending.extend(chunk)
        while b"\n" in pending:
            line, _, rest = bytes(pending).partition(b"\n")
            pending[:] = rest
            if line == b"cpu":
                os.write(1, f"{time.process_time()!r}\n".encode())

    loop.add_reader(0, readable)
    os.write(1, b"ready\n")
    await ended


# -- the gateway side -----------------------------------------------------------------------------
class Client(Protocol):
    """A channel as the gateway sees it: `send` a batch, `on_frame` called with each answer."""

    on_frame: OnFrame

    async def send(self, frame: bytes) -> None: ...


class NatsClient:
    """Shoal's gateway: batches published with a reply subject in one write a turn
    (scheduler/batching/pump.py), answers read by an inline subscription (shared/bus/dispatch.py)."""

    def __init__(self, nc: Any) -> None:
        self._nc = nc
        self.on_frame: OnFrame = _nothing

    @classmethod
    async def open(cls, url: str) -> NatsClient:
        client = cls(await connection.connect(url, "bench-gateway"))

        async def answered(msg: Any) -> None:
            client.on_frame(msg.data)

        await hot_path.subscribe(client._nc, f"{INBOX}.*", answered)
        await connection.settled(client._nc)
        return client

    async def send(self, frame: bytes) -> None:
        await hot_path.publish_all(self._nc, [Outgoing(BATCH_SUBJECT, frame, f"{INBOX}.done")])

    async def close(self) -> None:
        await self._nc.close()


class SocketClient:
    def __init__(self) -> None:
        self.on_frame: OnFrame = _nothing
        self.gone: Callable[[], None] = _nothing_more
        self.protocol: FrameProtocol | None = None

    @classmethod
    async def open(cls, path: str, buffer: int = 0) -> SocketClient:
        client = cls()
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_unix_connection(
            lambda: FrameProtocol(lambda frame: client.on_frame(frame), lambda: client.gone(), buffer), path
        )
        client.protocol = protocol
        return client

    async def send(self, frame: bytes) -> None:
        assert self.protocol is not None
        self.protocol.write(frame)


class StreamsClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self.on_frame: OnFrame = _nothing
        self.gone: Callable[[], None] = _nothing_more
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def open(cls, path: str) -> StreamsClient:
        return cls(*await asyncio.open_unix_connection(path))

    async def _read(self) -> None:
        reader = self._reader
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                frame = await reader.readexactly(_LENGTH.unpack(await reader.readexactly(4))[0])
                self.on_frame(frame)  # looked up after the wait: each case sets its own
        self.gone()

    async def send(self, frame: bytes) -> None:
        self._writer.writelines((_LENGTH.pack(len(frame)), frame))


class RingClient:
    def __init__(self, end: RingEnd) -> None:
        self._end = end
        self.on_frame: OnFrame = _nothing
        end.on_frame = lambda frame: self.on_frame(frame)

    async def send(self, frame: bytes) -> None:
        self._end.write(frame)


# -- driving one case -----------------------------------------------------------------------------
async def drive(client: Client, size: int, concurrency: int, seconds: float) -> tuple[list[int], float]:
    """`concurrency` batches kept in flight for `seconds`: each slot sends its next batch when its
    last one is answered. Returns each round trip's nanoseconds and the wall time."""
    loop = asyncio.get_running_loop()
    waiting: list[asyncio.Future[None] | None] = [None] * concurrency
    latencies: list[int] = []

    def answered(frame: bytes) -> None:
        future = waiting[_KEY.unpack_from(frame)[0]]
        if future is not None:
            future.set_result(None)

    client.on_frame = answered
    frames = [_KEY.pack(slot) + b"x" * (size - _KEY.size) for slot in range(concurrency)]  # built once
    start = time.perf_counter_ns()
    until = start + int(seconds * 1e9)

    async def slot(index: int) -> None:
        frame, clock = frames[index], time.perf_counter_ns
        while (sent := clock()) < until:
            waiting[index] = future = loop.create_future()
            await client.send(frame)
            await future
            latencies.append(clock() - sent)

    await asyncio.gather(*(slot(i) for i in range(concurrency)))
    return latencies, (time.perf_counter_ns() - start) / 1e9


@dataclass
class Result:
    channel: str
    size: int
    concurrency: int
    repeat: int
    p50_us: float
    p99_us: float
    round_trips_per_s: float
    gateway_cpu_us: float  # per round trip
    worker_cpu_us: float
    nats_server_cpu_us: float
    load: float  # 1-minute load average when the case ended

    @property
    def cpu_us(self) -> float:
        return self.gateway_cpu_us + self.worker_cpu_us + self.nats_server_cpu_us


class Worker:
    """The worker process and its control pipe."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        assert process.stdout is not None and process.stdin is not None
        self._out, self._in = process.stdout, process.stdin
        if self._out.readline().strip() != b"ready":
            raise SystemExit("the worker did not start")

    def cpu_s(self) -> float:
        """Asked between cases only, when nothing is in flight: blocking here costs no one."""
        self._in.write(b"cpu\n")
        self._in.flush()
        return float(self._out.readline())


def proc_cpu_s(pid: int) -> float:
    """A process's CPU seconds (all threads) from /proc: what nats-server spent."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(
    client: Client, worker: Worker, nats_pid: int, case: tuple[str, int, int, int], seconds: float, warmup: float
) -> Result:
    channel, size, concurrency, repeat = case
    await drive(client, size, concurrency, warmup)
    cpu0, worker0, server0 = time.process_time(), worker.cpu_s(), proc_cpu_s(nats_pid)
    latencies, wall = await drive(client, size, concurrency, seconds)
    cpu, worker_cpu = time.process_time() - cpu0, worker.cpu_s() - worker0
    server = proc_cpu_s(nats_pid) - server0 if channel == "nats" else 0.0
    latencies.sort()
    n = len(latencies)
    return Result(
        channel=channel,
        size=size,
        concurrency=concurrency,
        repeat=repeat,
        p50_us=latencies[n // 2] / 1e3,
        p99_us=latencies[min(n - 1, int(n * 0.99))] / 1e3,
        round_trips_per_s=n / wall,
        gateway_cpu_us=cpu / n * 1e6,
        worker_cpu_us=worker_cpu / n * 1e6,
        nats_server_cpu_us=server / n * 1e6,
        load=os.getloadavg()[0],
    )


def show(result: Result) -> None:
    print(
        f"{result.channel:<12} {result.size:>6} B c={result.concurrency:<3} #{result.repeat}"
        f"  p50 {result.p50_us:7.1f} µs  p99 {result.p99_us:7.1f} µs  {result.round_trips_per_s:8,.0f} rt/s"
        f"  cpu µs/rt: gateway {result.gateway_cpu_us:6.1f} worker {result.worker_cpu_us:6.1f}"
        f" nats-server {result.nats_server_cpu_us:6.1f} all {result.cpu_us:6.1f}  load {result.load:.2f}",
        flush=True,
    )


# -- the run --------------------------------------------------------------------------------------
@dataclass
class Setup:
    """Everything both processes share: made here, handed to the worker by path and by fd."""

    nats_url: str
    nats_pid: int
    directory: str  # 0700, as Shoal's runtime directory: the sockets live here
    ring_path: str
    rings: mmap.mmap  # mapped before the worker starts: the file is unlinked once the worker has it too
    eventfds: tuple[int, int]  # to the worker, to the gateway
    pipe_to_worker: tuple[int, int]
    pipe_to_gateway: tuple[int, int]


def socket_path(directory: str, channel: str) -> str:
    return os.path.join(directory, f"w-{channel}.sock")


def make_setup(nats_url: str, nats_pid: int) -> Setup:
    def nonblocking_pipe() -> tuple[int, int]:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        return read_fd, write_fd

    flags = os.EFD_NONBLOCK
    ring_path = make_ring_file()
    return Setup(
        nats_url=nats_url,
        nats_pid=nats_pid,
        directory=tempfile.mkdtemp(prefix="shoal-bench-run-"),  # mkdtemp makes it 0700
        ring_path=ring_path,
        rings=map_rings(ring_path),
        eventfds=(os.eventfd(0, flags), os.eventfd(0, flags)),
        pipe_to_worker=nonblocking_pipe(),
        pipe_to_gateway=nonblocking_pipe(),
    )


def start_worker(setup: Setup, loop_name: str) -> Worker:
    worker_fds = (setup.pipe_to_worker[0], setup.pipe_to_gateway[1])
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--loop", loop_name]
    command += ["--nats-url", setup.nats_url, "--socket-dir", setup.directory]
    command += ["--ring", setup.ring_path, "--eventfds", ",".join(map(str, setup.eventfds))]
    command += ["--pipes", ",".join(map(str, worker_fds))]
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(*setup.eventfds, *worker_fds)
    )
    for fd in worker_fds:  # the worker's ends are its own: a pipe ends only when every writer is gone
        os.close(fd)
    worker = Worker(process)
    os.unlink(setup.ring_path)  # both processes have it mapped: nothing is left in /dev/shm after a crash
    return worker


async def open_clients(setup: Setup, channels: list[str]) -> dict[str, Client]:
    mapping = setup.rings
    loop = asyncio.get_running_loop()
    openers: dict[str, Callable[[], Awaitable[Client]]] = {
        "nats": lambda: NatsClient.open(setup.nats_url),
        "unix": lambda: SocketClient.open(socket_path(setup.directory, "unix")),
        "unix-4mib": lambda: SocketClient.open(socket_path(setup.directory, "unix-4mib"), SOCKET_BUFFER),
        "streams": lambda: StreamsClient.open(socket_path(setup.directory, "streams")),
    }
    clients = {name: await openers[name]() for name in channels if name in openers}
    bells: dict[str, tuple[Doorbell, Doorbell]] = {
        "shm-eventfd": (EventfdBell(setup.eventfds[0]), EventfdBell(setup.eventfds[1])),
        "shm-pipe": (
            PipeBell(setup.pipe_to_gateway[0], setup.pipe_to_worker[1]),
            PipeBell(setup.pipe_to_gateway[0], setup.pipe_to_worker[1]),
        ),
    }
    for name, (out_bell, in_bell) in bells.items():
        if name in channels:
            to_worker, to_gateway = ring_pair(mapping, name)
            end = RingEnd(to_worker, to_gateway, out_bell, in_bell)
            end.start(loop)
            clients[name] = RingClient(end)
    return clients


async def run_all(args: argparse.Namespace, setup: Setup, worker: Worker) -> list[Result]:
    clients = await open_clients(setup, args.channels)
    results: list[Result] = []
    for size in args.sizes:
        for concurrency in args.concurrency:
            for repeat in range(1, args.repeats + 1):
                for channel in args.channels:
                    case = (channel, size, concurrency, repeat)
                    results.append(
                        await measure(clients[channel], worker, setup.nats_pid, case, args.seconds, args.warmup)
                    )
                    show(results[-1])
    await dead_peer(clients, worker, args.channels)
    for client in clients.values():
        if isinstance(client, NatsClient):
            await client.close()
    return results


async def dead_peer(clients: dict[str, Client], worker: Worker, channels: list[str]) -> None:
    """SIGKILL the worker; how soon does each channel tell the gateway? A pidfd stands for the
    check that a ring needs (it works within one pid namespace)."""
    loop = asyncio.get_running_loop()
    noticed: dict[str, float] = {}
    start = 0.0

    def notice(name: str) -> Callable[[], None]:
        return lambda: noticed.setdefault(name, time.perf_counter() - start)

    for name, client in clients.items():
        if isinstance(client, (SocketClient, StreamsClient)):
            client.gone = notice(name)
        elif isinstance(client, RingClient):
            client._end.on_gone = notice(name)
    pidfd = os.pidfd_open(worker.process.pid)
    loop.add_reader(pidfd, notice("pidfd"))
    start = time.perf_counter()
    worker.process.send_signal(signal.SIGKILL)
    await asyncio.sleep(1.0)
    loop.remove_reader(pidfd)
    os.close(pidfd)
    worker.process.wait()
    for name in [*channels, "pidfd"]:
        at = noticed.get(name)
        print(
            f"worker killed: {name:<12} " + (f"noticed after {at * 1e3:.2f} ms" if at is not None else "no sign in 1 s")
        )


def summary(results: list[Result]) -> str:
    """A markdown table: the median over repeats of each figure, and its ratio against NATS."""
    groups: dict[tuple[int, int, str], list[Result]] = {}
    for result in results:
        groups.setdefault((result.size, result.concurrency, result.channel), []).append(result)
    lines = [
        "| size | c | channel | p50 µs | p99 µs | round trips/s | CPU µs/rt: all (gateway + worker + nats-server) "
        "| p50 ÷ NATS | rt/s ÷ NATS | CPU ÷ NATS | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (size, concurrency, channel), group in groups.items():
        row, base = Medians.of(group), Medians.of(groups[(size, concurrency, "nats")])
        lines.append(f"| {size:,} B | {concurrency} | {channel} | {row.cells()} | {row.against(base)} | {row.loads} |")
    return "\n".join(lines)


@dataclass
class Medians:
    """One case's figures, the median over its repeats."""

    p50: float
    p99: float
    rate: float
    cpu: float
    parts: tuple[float, float, float]
    loads: str

    @classmethod
    def of(cls, group: list[Result]) -> Medians:
        def med(figure: Callable[[Result], float]) -> float:
            return statistics.median(figure(r) for r in group)

        parts = (med(lambda r: r.gateway_cpu_us), med(lambda r: r.worker_cpu_us), med(lambda r: r.nats_server_cpu_us))
        loads = ", ".join(f"{r.load:.1f}" for r in group)
        return cls(
            med(lambda r: r.p50_us),
            med(lambda r: r.p99_us),
            med(lambda r: r.round_trips_per_s),
            med(lambda r: r.cpu_us),
            parts,
            loads,
        )

    def cells(self) -> str:
        parts = " + ".join(f"{part:.1f}" for part in self.parts if part)
        return f"{self.p50:.0f} | {self.p99:.0f} | {self.rate:,.0f} | {self.cpu:.1f} ({parts})"

    def against(self, base: Medians) -> str:
        return f"{self.p50 / base.p50:.2f}× | {self.rate / base.rate:.2f}× | {self.cpu / base.cpu:.2f}×"


def gateway_main(args: argparse.Namespace) -> None:
    print(f"load average at start: {os.getloadavg()}; loop {args.loop}", flush=True)
    with NatsServer() as nats:
        assert nats.process is not None
        setup = make_setup(nats.url, nats.process.pid)
        worker = start_worker(setup, args.loop)
        try:
            results = run_loop(args.loop, run_all(args, setup, worker))
        finally:
            if worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(setup.ring_path)
            shutil.rmtree(setup.directory, ignore_errors=True)  # the worker's sockets
    print(f"load average at end: {os.getloadavg()}\n\n{summary(results)}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump([asdict(r) for r in results], out, indent=1)


def run_loop(name: str, coroutine: Awaitable[Any]) -> Any:
    """The loop Shoal's services run (shared/process/runtime.py): uvloop where it is installed."""
    if name == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coroutine)  # type: ignore[arg-type]
    return asyncio.run(coroutine)  # type: ignore[arg-type]


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0, help="each case, measured (default 3)")
    ap.add_argument("--warmup", type=float, default=0.5, help="each case, before it is measured")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", type=_ints, default=[200, 4096, 65536], help="bytes per frame, comma-separated")
    ap.add_argument("--concurrency", type=_ints, default=[1, 16], help="batches in flight, comma-separated")
    ap.add_argument("--channels", type=lambda text: text.split(","), default=list(CHANNELS))
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    ap.add_argument("--json", help="write every run's figures here")
    internal = ap.add_argument_group("internal: the worker process")
    internal.add_argument("--worker", action="store_true")
    for name in ("--nats-url", "--socket-dir", "--ring", "--eventfds", "--pipes"):
        internal.add_argument(name)
    args = ap.parse_args()
    unknown = set(args.channels) - set(CHANNELS)
    if unknown:
        ap.error(f"unknown channels {sorted(unknown)}: choose from {', '.join(CHANNELS)}")
    if "nats" not in args.channels and not args.worker:
        args.channels.insert(0, "nats")  # the reference every ratio is taken against
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        eventfds, pipes = _ints(args.eventfds), _ints(args.pipes)
        worker = WorkerArgs(args.nats_url, args.socket_dir, args.ring, (eventfds[0], eventfds[1]), (pipes[0], pipes[1]))
        run_loop(args.loop, worker_main(worker))
        return
    gateway_main(args)


if __name__ == "__main__":
    main()

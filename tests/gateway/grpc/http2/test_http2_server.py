"""Shoal's gRPC server (services/gateway/grpc/http2/http2_server.py) driven by grpcio's own client: answers,
statuses, deadlines, cancellation, flow control both ways, compression, streams, and calls that
arrive in one read starting in one loop iteration. The servicer is a small one of the test's."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import hpack
import pytest
from tritonclient.grpc import service_pb2 as pb

from services.gateway.grpc.http2 import frames as f
from services.gateway.grpc.http2.http2_connection import KeepAlive
from services.gateway.grpc.http2.http2_server import GrpcListener, tls_context

SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
INFER = "/inference.GRPCInferenceService/ModelInfer"


class Servicer:
    def __init__(self) -> None:
        self.started: list[str] = []
        self.iterations: list[list[str]] = []  # request ids, by the loop iteration their call started in
        self.cancelled = asyncio.Event()
        self.release = asyncio.Event()
        self.flooded = 0  # messages a "flood" stream produced
        self.flood_asked_again = asyncio.Event()  # its second message was asked for

    def _started(self, rid: str) -> None:
        self.started.append(rid)
        if not self.iterations or self.iterations[-1] is not self._current:
            self._current: list[str] = []
            self.iterations.append(self._current)
            asyncio.get_running_loop().call_soon(self._close_iteration)
        self._current.append(rid)

    def _close_iteration(self) -> None:
        self._current = []

    async def ModelInfer(self, request: pb.ModelInferRequest, context) -> pb.ModelInferResponse:
        self._started(request.id)
        metadata = dict(context.invocation_metadata())
        if request.model_name == "fail":
            await context.abort(grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'fail' ¡ 100%")
        if request.model_name == "wait":
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        if request.model_name == "gzip":
            context.set_compression(grpc.Compression.Gzip)
        answer = pb.ModelInferResponse(model_name=request.model_name, id=metadata.get("x-key", request.id))
        answer.raw_output_contents.extend(request.raw_input_contents)
        return answer

    async def ModelStreamInfer(self, requests: AsyncIterator[pb.ModelInferRequest], context):
        async for request in requests:
            if request.model_name == "flood":  # 64 KiB messages, as fast as they are asked for
                for i in range(200):
                    if i == 1:
                        self.flood_asked_again.set()
                    self.flooded += 1
                    answer = pb.ModelInferResponse(id=str(i))
                    answer.raw_output_contents.append(b"x" * 65_536)
                    yield pb.ModelStreamInferResponse(infer_response=answer)
                continue
            if request.model_name == "fail":
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad stream")
            yield pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(id=request.id))


@pytest.fixture
async def served():
    servicer = Servicer()
    listener = GrpcListener(servicer, SERVICE, pb, KeepAlive())
    port = await listener.start("127.0.0.1", 0)
    try:
        yield servicer, port
    finally:
        await listener.stop(0)


def infer(channel: grpc.aio.Channel, **kwargs):
    return channel.unary_unary(
        INFER,
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelInferResponse.FromString,
    )


async def test_unary_answers_metadata_and_statuses(served):
    _, port = served
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = infer(channel)
        answer = await call(pb.ModelInferRequest(model_name="m", id="a", raw_input_contents=[b"xy"]), timeout=10)
        assert (answer.model_name, answer.id, list(answer.raw_output_contents)) == ("m", "a", [b"xy"])
        assert (await call(pb.ModelInferRequest(id="a"), metadata=[("x-key", "k")], timeout=10)).id == "k"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(pb.ModelInferRequest(model_name="fail"), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert err.value.details() == "Request for unknown model: 'fail' ¡ 100%"
        unknown = channel.unary_unary("/inference.GRPCInferenceService/Nope")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await unknown(b"", timeout=10)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_large_messages_flow_both_ways(served):
    _, port = served
    big = bytes(range(256)) * (12 * 4096)  # 12 MiB: beyond every default window
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        answers = await asyncio.gather(
            *(infer(channel)(pb.ModelInferRequest(id=str(i), raw_input_contents=[big]), timeout=60) for i in range(3))
        )
    assert all(a.raw_output_contents[0] == big for a in answers)


async def test_compressed_requests_and_responses(served):
    _, port = served
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", compression=grpc.Compression.Gzip) as channel:
        data = b"a" * 100_000
        answer = await infer(channel)(pb.ModelInferRequest(model_name="gzip", raw_input_contents=[data]), timeout=10)
        assert answer.raw_output_contents[0] == data


async def test_deadline_and_client_cancel_cancel_the_handler(served):
    servicer, port = served
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await infer(channel)(pb.ModelInferRequest(model_name="wait"), timeout=0.3)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(servicer.cancelled.wait(), 10)
        servicer.cancelled.clear()
        call = infer(channel)(pb.ModelInferRequest(model_name="wait", id="c"), timeout=30)
        while "c" not in servicer.started:
            await asyncio.sleep(0.01)  # polls a condition; the bound is the test's timeout
        call.cancel()
        await asyncio.wait_for(servicer.cancelled.wait(), 10)
        assert (await infer(channel)(pb.ModelInferRequest(id="after"), timeout=10)).id == "after"


async def test_a_stream_answers_each_request_and_ends_with_its_status(served):
    _, port = served
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        call = stream(iter([pb.ModelInferRequest(id=str(i)) for i in range(50)]), timeout=30)
        assert [r.infer_response.id async for r in call] == [str(i) for i in range(50)]
        assert await call.code() == grpc.StatusCode.OK
        failing = stream(iter([pb.ModelInferRequest(id="1"), pb.ModelInferRequest(model_name="fail")]), timeout=30)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [r async for r in failing]
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "bad stream")


async def test_a_stream_waits_for_a_client_that_does_not_read(served):
    """A client whose window is full (it reads nothing) holds the streaming call before its next
    message: what waits for it is one message, not everything the call could produce
    (docs/reliability.md, "Overload"). Before, every message went into the stream's pending list."""
    servicer, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        path = b"/inference.GRPCInferenceService/ModelStreamInfer"
        headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", b"t")]
        headers += [(b"content-type", b"application/grpc"), (b"te", b"trailers")]
        block = bytes(hpack.Encoder().encode(headers))
        body = f.message(pb.ModelInferRequest(model_name="flood").SerializeToString())
        writer.write(
            f.PREFACE
            + f.settings([(f.INITIAL_WINDOW_SIZE, 1024)])  # room for 1 KiB of the first message, never more
            + f.frame(f.HEADERS, f.END_HEADERS, 1, block)
            + f.frame(f.DATA, 0, 1, body)
        )
        await writer.drain()
        await read_frames(reader, lambda got: any(kind == f.DATA for kind, *_ in got))  # the first KiB came
        assert servicer.flooded == 1
        with pytest.raises(TimeoutError):  # the call is not asked for its second message
            await asyncio.wait_for(servicer.flood_asked_again.wait(), 1.0)
        assert servicer.flooded == 1
    finally:
        writer.close()


async def test_calls_that_arrive_in_one_read_start_in_one_loop_iteration(served):
    """What the dispatcher needs to send them to the scheduler in one bus message (docs/grpc.md)."""
    servicer, port = served
    encoder = hpack.Encoder()
    wire = [f.PREFACE, f.settings([])]
    for i in range(8):
        stream_id = 2 * i + 1
        headers = [(":method", "POST"), (":scheme", "http"), (":path", INFER), (":authority", "x")]
        headers += [("content-type", "application/grpc"), ("te", "trailers")]
        wire.append(f.frame(f.HEADERS, f.END_HEADERS, stream_id, encoder.encode(headers)))
        body = f.message(pb.ModelInferRequest(id=str(i)).SerializeToString())
        wire.append(f.frame(f.DATA, f.END_STREAM, stream_id, body))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"".join(wire))  # one write: one read on the server's side (loopback, a few hundred bytes)
        await writer.drain()
        received = b""
        while received.count(f.OK_TRAILERS) < 8:
            chunk = await asyncio.wait_for(reader.read(65536), 10)
            assert chunk, "the server closed the connection"
            received += chunk
    finally:
        writer.close()
        await writer.wait_closed()
    assert [sorted(group, key=int) for group in servicer.iterations] == [[str(i) for i in range(8)]]


async def test_stop_lets_calls_finish_and_refuses_new_ones(served):
    servicer, port = served
    listener = GrpcListener(servicer, SERVICE, pb, KeepAlive())
    port = await listener.start("127.0.0.1", 0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = asyncio.ensure_future(infer(channel)(pb.ModelInferRequest(model_name="wait", id="w"), timeout=30))
        while "w" not in servicer.started:
            await asyncio.sleep(0.01)  # polls a condition; the bound is the test's timeout
        stopping = asyncio.ensure_future(listener.stop(30))
        servicer.release.set()
        assert (await call).id == "w"
        await asyncio.wait_for(stopping, 10)
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture
def certificate(tmp_path):
    """A self-signed certificate for 127.0.0.1 (openssl, as an operator would make one)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1"]
        + ["-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return str(cert), str(key)


async def test_tls_with_and_without_client_certificates(certificate):
    cert, key = certificate
    pem = Path(cert).read_bytes()
    for mutual in (False, True):
        listener = GrpcListener(Servicer(), SERVICE, pb, KeepAlive())
        port = await listener.start("127.0.0.1", 0, tls=tls_context(cert, key, cert if mutual else None, mutual))
        try:
            anonymous = grpc.ssl_channel_credentials(root_certificates=pem)
            async with grpc.aio.secure_channel(f"127.0.0.1:{port}", anonymous) as channel:
                call = infer(channel)(pb.ModelInferRequest(id="t"), timeout=10)
                if mutual:  # no client certificate: the handshake fails
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await call
                    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
                else:
                    assert (await call).id == "t"
            if mutual:
                signed = grpc.ssl_channel_credentials(pem, Path(key).read_bytes(), pem)
                async with grpc.aio.secure_channel(f"127.0.0.1:{port}", signed) as channel:
                    assert (await infer(channel)(pb.ModelInferRequest(id="m"), timeout=10)).id == "m"
        finally:
            await listener.stop(0)


async def read_frames(reader: asyncio.StreamReader, until) -> list[tuple[int, int, int, bytes]]:
    """Frames from the server until `until(frames)` holds or the connection closes."""
    frames: list[tuple[int, int, int, bytes]] = []
    while not until(frames):
        try:
            header = await asyncio.wait_for(reader.readexactly(9), 10)
        except asyncio.IncompleteReadError:
            break
        length, kind, flags, stream_id = f.parse_header(header, 0)
        frames.append((kind, flags, stream_id, await reader.readexactly(length)))
    return frames


async def test_a_client_that_pings_too_often_is_told_off():
    listener = GrpcListener(Servicer(), SERVICE, pb, KeepAlive(max_ping_strikes=1))
    port = await listener.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f.PREFACE + f.settings([]) + f.frame(f.PING, 0, 0, b"12345678") * 3)  # no call open
        frames = await read_frames(reader, lambda got: any(kind == f.GOAWAY for kind, *_ in got))
        acks = [payload for kind, flags, _, payload in frames if kind == f.PING and flags & f.ACK]
        goaway = next(payload for kind, _, _, payload in frames if kind == f.GOAWAY)
        assert acks == [b"12345678"]  # the first strike is forgiven, the second ends it
        assert (f.u32(goaway, 4), goaway[8:]) == (f.ENHANCE_YOUR_CALM, b"too_many_pings")
        assert await asyncio.wait_for(reader.read(), 10) == b""  # and the connection closes
    finally:
        writer.close()
        await writer.wait_closed()
        await listener.stop(0)


async def test_keepalive_pings_and_drops_a_client_that_does_not_answer():
    keepalive = KeepAlive(time_s=0.1, timeout_s=0.3, permit_without_calls=True, max_pings_without_data=0)
    listener = GrpcListener(Servicer(), SERVICE, pb, keepalive)
    port = await listener.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f.PREFACE + f.settings([]))
        frames = await read_frames(reader, lambda got: False)  # until the server closes the connection
        pings = [kind for kind, flags, _, _ in frames if kind == f.PING and not flags & f.ACK]
        assert pings and any(kind == f.GOAWAY for kind, *_ in frames)
    finally:
        writer.close()
        await writer.wait_closed()
        await listener.stop(0)


async def test_undecodable_requests_fail_with_internal(served):
    _, port = served
    garbage = b"\xff\xff\xff"  # not a ModelInferRequest
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await channel.unary_unary(INFER)(garbage, timeout=10)
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.INTERNAL, "Failed to parse request")
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [answer async for answer in stream(iter([garbage]), timeout=10)]
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.INTERNAL, "Failed to parse request")

"""A gRPC call on an HTTP/2 stream: the request's messages in, the servicer's answer and status out.

The servicer (services/gateway/grpc/servicer.py) is the one grpcio serves: its methods take the
request (or an async iterator of requests) and a context, and `await context.abort(code, text)`
to fail. `CallContext` is the part of `grpc.aio.ServicerContext` it uses, so both servers run the
same servicer. A call's status and text go out in the trailers, as gRPC's PROTOCOL-HTTP2 says.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import logging
import zlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from services.gateway.grpc.http2 import frames as f
from services.gateway.grpc.http2.http2_stream import Stream

log = logging.getLogger("shoal.gateway")

# tritonserver's gRPC message limit (INT32_MAX, src/common.h): a larger message, declared or once
# decompressed, is refused as grpc core refuses it, before it is buffered or inflated whole
MAX_MESSAGE = 2**31 - 1

# request headers that are the transport's, not the call's metadata (as grpcio leaves them out)
_TRANSPORT_HEADERS = frozenset(
    [b"te", b"content-type", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding", b"content-length"]
)


@dataclass(frozen=True)
class Method:
    name: str
    request: type[Message]
    streaming: bool  # a bidirectional stream (ModelStreamInfer); every other method is unary


def methods(service: ServiceDescriptor, module: Any) -> dict[bytes, Method]:
    """The service's methods by HTTP/2 path, their request types from the generated module."""
    return {
        f"/{service.full_name}/{m.name}".encode(): Method(
            m.name, getattr(module, m.input_type.name), m.client_streaming and m.server_streaming
        )
        for m in service.methods
    }


class CallContext:
    """What a servicer method may ask of its call (a subset of `grpc.aio.ServicerContext`)."""

    __slots__ = ("_headers", "_metadata", "_peer", "compress", "code", "details")

    def __init__(self, headers: list[tuple[bytes, bytes]], peer: str) -> None:
        self._headers = headers
        self._metadata: tuple[tuple[str, str | bytes], ...] | None = None  # made when asked for
        self._peer = peer
        self.compress = False
        self.code = grpc.StatusCode.OK
        self.details = ""

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        if self._metadata is None:
            self._metadata = _metadata(self._headers)
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def set_compression(self, compression: grpc.Compression) -> None:
        self.compress = compression == grpc.Compression.Gzip

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> NoReturn:
        self.code, self.details = code, details
        raise grpc.aio.AbortError()


class _Requests:
    """A stream's requests as the servicer iterates them, fed by the connection as they arrive."""

    __slots__ = ("_loop", "_items", "_ended", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[Message] = deque()
        self._ended = False
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: Message | None) -> None:
        """A request, or None: no more."""
        if item is None:
            self._ended = True
        else:
            self._items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> Message:
        while not self._items:
            if self._ended:
                raise StopAsyncIteration
            self._waiter = self._loop.create_future()
            await self._waiter
        return self._items.popleft()


class GrpcCall:
    """One call: started when its request is whole (unary) or at once (a stream)."""

    __slots__ = (
        "_calls",
        "_stream",
        "_method",
        "_context",
        "_buffer",
        "_task",
        "_timer",
        "_expired",
        "_encoding",
        "_gzip_ok",
        "_requests",
        "_answering",
        "_refused",
    )

    def __init__(self, calls: Calls, stream: Stream, method: Method, context: CallContext) -> None:
        self._calls = calls
        self._stream = stream
        self._method = method
        self._context = context
        self._buffer = bytearray()
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._expired = False
        self._encoding = b"identity"
        self._gzip_ok = False
        self._requests: _Requests | None = None
        self._answering = False  # response headers sent: the status goes in trailers, not trailers-only
        self._refused = False  # a message past the limit: answered, and the rest is dropped

    def start(self, headers: dict[bytes, bytes], timeout: float | None) -> None:
        self._encoding = headers.get(b"grpc-encoding", b"identity")
        self._gzip_ok = b"gzip" in headers.get(b"grpc-accept-encoding", b"")
        if timeout is not None:
            self._timer = self._stream.conn.loop.call_later(timeout, self._expire)
        if self._method.streaming:
            self._requests = _Requests(self._stream.conn.loop)
            self._launch(self._serve_stream(self._requests))

    # -- the connection's events -------------------------------------------------------------
    def data(self, chunk: bytes, end: bool) -> None:
        if self._refused:
            return
        if chunk:
            self._buffer += chunk
            declared = f.pending_size(self._buffer)
            if declared > MAX_MESSAGE or len(self._buffer) > MAX_MESSAGE + 5:
                self._refused, self._buffer = True, bytearray()
                self._fail_stream(grpc.StatusCode.RESOURCE_EXHAUSTED, _too_large(max(declared, MAX_MESSAGE + 1)))
                return
        if not self._method.streaming:
            if end:
                self._launch(self._serve_unary())
            return
        requests = self._requests
        if requests is None:  # the stream failed: what still comes is dropped
            return
        messages, self._buffer = f.split_messages(self._buffer)
        for compressed, payload in messages:
            try:
                requests.put(self._method.request.FromString(self._decompress(compressed, payload)))
            except _Status as status:
                self._fail_stream(status.code, status.details)
                return
            except (DecodeError, OSError, zlib.error):
                self._fail_stream(grpc.StatusCode.INTERNAL, "Failed to parse request")
                return
        if end:
            requests.put(None)

    def reset(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._done()

    # -- serving -------------------------------------------------------------------------------
    def _launch(self, coro: Any) -> None:
        self._task = self._calls.track(self._stream.conn.loop.create_task(coro))

    async def _serve_unary(self) -> None:
        context = self._context
        try:
            messages, rest = f.split_messages(self._buffer)
            if len(messages) != 1 or rest:
                raise _Status(grpc.StatusCode.INTERNAL, "expected one request message")
            request = self._method.request.FromString(self._decompress(*messages[0]))
            response = await getattr(self._calls.servicer, self._method.name)(request, context)
        except grpc.aio.AbortError:
            self._trailers_only(context.code, context.details)
        except _Status as status:
            self._trailers_only(status.code, status.details)
        except asyncio.CancelledError:
            self._cancelled()
        except (DecodeError, OSError, zlib.error):
            self._trailers_only(grpc.StatusCode.INTERNAL, "Failed to parse request")
        except Exception as exc:
            log.exception("unhandled error in %s", self._method.name)
            self._trailers_only(grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}")
        else:
            body, compressed = self._encode(response)
            stream = self._stream
            stream.send_headers(f.GZIP_RESPONSE_HEADERS if compressed else f.RESPONSE_HEADERS)
            stream.send(f.message(body, compressed), f.OK_TRAILERS)
        finally:
            self._done()

    async def _serve_stream(self, requests: _Requests) -> None:
        context = self._context
        stream = self._stream
        answers: AsyncIterator[Message] = getattr(self._calls.servicer, self._method.name)(requests, context)
        try:
            async for response in answers:
                body, compressed = self._encode(response)
                if not self._answering:
                    self._answering = True
                    stream.send_headers(f.GZIP_RESPONSE_HEADERS if compressed else f.RESPONSE_HEADERS)
                stream.send(f.message(body, compressed))
                if stream.pending:  # the client's window is full: the next message waits for it to read
                    await stream.drained()
        except grpc.aio.AbortError:
            self._status(context.code, context.details)
        except asyncio.CancelledError:
            self._cancelled()
        except Exception as exc:
            log.exception("unhandled error in %s", self._method.name)
            self._status(grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}")
        else:
            self._status(grpc.StatusCode.OK, "")
        finally:
            await _close(answers)
            self._done()

    def _encode(self, response: Message) -> tuple[bytes, bool]:
        body = response.SerializeToString()
        if self._context.compress and self._gzip_ok:
            return gzip.compress(body), True
        return body, False

    def _decompress(self, compressed: bool, payload: bytes) -> bytes:
        if not compressed:
            return payload
        if self._encoding in (b"gzip", b"deflate"):  # inflated up to the limit only: a small bomb stays small
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if self._encoding == b"gzip" else zlib.MAX_WBITS)
            out = inflater.decompress(payload, MAX_MESSAGE + 1)
            if len(out) > MAX_MESSAGE:
                raise _Status(grpc.StatusCode.RESOURCE_EXHAUSTED, _too_large(len(out)))
            return out
        raise _Status(grpc.StatusCode.UNIMPLEMENTED, f"Compression algorithm '{self._encoding.decode()}' not supported")

    # -- the end of a call --------------------------------------------------------------------
    def _status(self, code: grpc.StatusCode, details: str) -> None:
        if self._answering:
            self._stream.send(b"", f.status_trailers(code.value[0], details))
        else:
            self._trailers_only(code, details)

    def _trailers_only(self, code: grpc.StatusCode, details: str) -> None:
        self._stream.send_trailers_only(f.RESPONSE_HEADERS + f.status_trailers(code.value[0], details))

    def _cancelled(self) -> None:
        """The client reset the stream (nothing to answer), its deadline passed, or the server stops."""
        if self._expired:
            self._status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        else:
            self._stream.cancel()

    def _expire(self) -> None:
        self._expired = True
        if self._task is not None:
            self._task.cancel()
        else:  # the request is not whole yet
            self._status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _fail_stream(self, code: grpc.StatusCode, details: str) -> None:
        self._requests = None
        if self._task is not None:
            self._task.cancel()
        self._status(code, details)

    def _done(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _too_large(size: int) -> str:
    return f"Received message larger than max ({size} vs. {MAX_MESSAGE})"


class _Status(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


async def _close(answers: AsyncIterator[Message]) -> None:
    close = getattr(answers, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:  # already failed: its error was answered
            pass


class _Refused:
    """The connection's view of a call that was answered at once (unknown method, bad headers)."""

    def data(self, chunk: bytes, end: bool) -> None:
        pass

    def reset(self) -> None:
        pass


class Calls:
    """Opens a call per stream on a servicer, and keeps its tasks for a graceful stop."""

    def __init__(self, servicer: Any, service: ServiceDescriptor, module: Any) -> None:
        self.servicer = servicer
        self._methods = methods(service, module)
        self._tasks: set[asyncio.Task[None]] = set()

    def track(self, task: asyncio.Task[None]) -> asyncio.Task[None]:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def wait(self, timeout: float) -> None:
        """The calls in flight finish, or are cancelled after `timeout` seconds."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)

    def open(self, stream: Stream, headers: list[tuple[bytes, bytes]]) -> GrpcCall | _Refused:
        fields = dict(headers)
        method = self._methods.get(fields.get(b":path", b""))
        if method is None:
            stream.send_trailers_only(
                f.RESPONSE_HEADERS + f.status_trailers(grpc.StatusCode.UNIMPLEMENTED.value[0], "Method not found!")
            )
            return _Refused()
        timeout = None
        if b"grpc-timeout" in fields:
            timeout = f.timeout_seconds(fields[b"grpc-timeout"])
        call = GrpcCall(self, stream, method, CallContext(headers, stream.conn.peer))
        call.start(fields, timeout)
        return call


def _metadata(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[str, str | bytes], ...]:
    out: list[tuple[str, str | bytes]] = []
    for key, value in headers:
        if key[:1] == b":" or key in _TRANSPORT_HEADERS:
            continue
        name = key.decode("latin-1")
        out.append((name, base64.b64decode(value + b"==") if name.endswith("-bin") else value.decode("latin-1")))
    return tuple(out)

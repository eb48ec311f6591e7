"""Shoal's own gRPC server: HTTP/2 connections on the gateway's event loop (docs/grpc.md).

`start` listens (TLS with ALPN "h2" when asked), each connection is a `GrpcConnection`, each
stream a call on the servicer. `stop` is grpcio's: no new calls (GOAWAY), the calls in flight may
finish within the grace period, then the connections close.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

from google.protobuf.descriptor import ServiceDescriptor

from services.gateway.grpc.http2.grpc_calls import Calls
from services.gateway.grpc.http2.http2_connection import GrpcConnection, KeepAlive

CLOSE_S = 1.0  # how long `stop` waits for closed connections to be gone


class GrpcListener:
    def __init__(self, servicer: Any, service: ServiceDescriptor, module: Any, keepalive: KeepAlive) -> None:
        self._calls = Calls(servicer, service, module)
        self._keepalive = keepalive
        self._connections: set[GrpcConnection] = set()
        self._server: asyncio.Server | None = None
        self._all_lost: asyncio.Event | None = None  # set by `stop` while it waits for the last one

    async def start(self, host: str, port: int, reuse_port: bool = False, tls: ssl.SSLContext | None = None) -> int:
        """Listening on (host, port); returns the port (the one the kernel chose for 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._connection, host, port, reuse_port=reuse_port or None, ssl=tls, backlog=1024
        )
        return int(self._server.sockets[0].getsockname()[1])

    def _connection(self) -> GrpcConnection:
        conn = GrpcConnection(self._calls, self._keepalive, self._lost)
        self._connections.add(conn)
        return conn

    def _lost(self, conn: GrpcConnection) -> None:
        self._connections.discard(conn)
        if not self._connections and self._all_lost is not None:
            self._all_lost.set()

    async def stop(self, grace: float | None) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.goaway()
            if conn.idle:
                conn.close()
        await self._calls.wait(grace or 0.0)
        for conn in list(self._connections):
            conn.close()
        if self._connections:  # a transport is lost a loop iteration after its close: stopped means closed
            self._all_lost = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._all_lost.wait(), CLOSE_S)


def tls_context(cert: str, key: str, root: str | None, mutual: bool) -> ssl.SSLContext:
    """TLS as grpcio's `ssl_server_credentials`: client certificates required with `mutual`,
    asked for (and checked against `root`) when only a root is given."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])
    if root:
        context.load_verify_locations(root)
        context.verify_mode = ssl.CERT_REQUIRED if mutual else ssl.CERT_OPTIONAL
    return context

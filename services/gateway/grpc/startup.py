"""The gRPC listener with tritonserver's `--grpc-*` settings: Shoal's own HTTP/2 server on the event
loop (services/gateway/grpc/http2/http2_server.py, the default), or grpcio's asyncio server
(`--grpc-server=grpcio`, the fallback).

Keepalive flags map one to one onto gRPC core channel arguments (as tritonserver sets them);
messages have no size limit (as in Triton: the HTTP input-size limit is HTTP's); SO_REUSEPORT
is off unless `--reuse-grpc-port`, so a second server on a busy port fails instead of sharing it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from inference.restrictions import CATEGORIES
from inference.server import InferenceServer
from services.gateway.grpc.http2.http2_connection import KeepAlive
from services.gateway.grpc.http2.http2_server import GrpcListener, tls_context
from services.gateway.grpc.servicer import GrpcService, Restrictions
from shared.process.settings import GatewaySettings

COMPRESSION_LEVELS = ("none", "low", "medium", "high")


def restrictions(entries: list[str]) -> Restrictions:
    """`--grpc-restricted-protocol=<category>[,<category>...]:<key>=<value>`, repeatable."""
    out: Restrictions = {}
    for entry in entries:
        categories, _, header = entry.partition(":")
        key, _, value = header.partition("=")
        if not key or not _:
            raise ValueError(f"--grpc-restricted-protocol expects <protocols>:<key>=<value>, got '{entry}'")
        for category in categories.split(","):
            if category not in CATEGORIES:
                raise ValueError(f"unknown restricted protocol '{category}' (one of {', '.join(sorted(CATEGORIES))})")
            if category in out:
                raise ValueError(f"restricted protocol '{category}' is given more than once")
            out[category] = (key.lower(), value)  # gRPC metadata keys arrive lower-cased
    return out


def channel_options(settings: GatewaySettings) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", -1),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 1 if settings.reuse_grpc_port else 0),
        ("grpc.keepalive_time_ms", settings.grpc_keepalive_time),
        ("grpc.keepalive_timeout_ms", settings.grpc_keepalive_timeout),
        ("grpc.keepalive_permit_without_calls", int(settings.grpc_keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", settings.grpc_http2_max_pings_without_data),
        (
            "grpc.http2.min_recv_ping_interval_without_data_ms",
            settings.grpc_http2_min_recv_ping_interval_without_data,
        ),
        ("grpc.http2.max_ping_strikes", settings.grpc_http2_max_ping_strikes),
    ]


def credentials(settings: GatewaySettings) -> grpc.ServerCredentials | None:
    if not settings.grpc_use_ssl:
        return None
    key = Path(settings.grpc_server_key).read_bytes()
    cert = Path(settings.grpc_server_cert).read_bytes()
    root = Path(settings.grpc_root_cert).read_bytes() if settings.grpc_root_cert else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=root, require_client_auth=settings.grpc_use_ssl_mutual
    )


class _GenericHandlersOnly:
    """The server as the generated `add_..._to_server` sees it: the service's methods are added as
    a generic handler only, not also as registered methods. grpcio's asyncio server keeps one
    pending call request per registered method and waits on all of them (`asyncio.wait`) for every
    call it accepts: ~21 futures per RPC for this service (7% of the gateway's loop-thread CPU per
    gRPC request, docs/grpc.md). The generic handler serves the same methods."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        pass  # on purpose: see the class's docstring


class Listener(Protocol):
    async def stop(self, grace: float | None) -> None: ...


def keepalive(settings: GatewaySettings) -> KeepAlive:
    return KeepAlive(
        time_s=settings.grpc_keepalive_time / 1000,
        timeout_s=settings.grpc_keepalive_timeout / 1000,
        permit_without_calls=settings.grpc_keepalive_permit_without_calls,
        min_ping_interval_s=settings.grpc_http2_min_recv_ping_interval_without_data / 1000,
        max_ping_strikes=settings.grpc_http2_max_ping_strikes,
        max_pings_without_data=settings.grpc_http2_max_pings_without_data,
    )


async def start(settings: GatewaySettings, server: InferenceServer) -> Listener:
    """A started gRPC server (raises if the address cannot be bound)."""
    service = GrpcService(
        server,
        restrictions(settings.grpc_restricted_protocol),
        compress=settings.grpc_infer_response_compression_level != "none",
        header_forward_pattern=settings.grpc_header_forward_pattern,
    )
    if settings.grpc_server == "grpcio":
        return await _start_grpcio(settings, service)
    listener = GrpcListener(
        service, service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"], service_pb2, keepalive(settings)
    )
    tls = None
    if settings.grpc_use_ssl:
        root = settings.grpc_root_cert or None
        tls = tls_context(settings.grpc_server_cert, settings.grpc_server_key, root, settings.grpc_use_ssl_mutual)
    await listener.start(settings.grpc_address, settings.grpc_port, settings.reuse_grpc_port, tls)
    return listener


async def _start_grpcio(settings: GatewaySettings, service: GrpcService) -> Listener:
    listener = grpc.aio.server(options=channel_options(settings))  # grpc.aio.Server: untyped
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(service, _GenericHandlersOnly(listener))
    address = f"{settings.grpc_address}:{settings.grpc_port}"
    creds = credentials(settings)
    port = listener.add_secure_port(address, creds) if creds else listener.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind the gRPC endpoint to {address}")
    await listener.start()
    started: Listener = listener
    return started

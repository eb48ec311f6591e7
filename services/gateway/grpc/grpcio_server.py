"""The gRPC fallback (`--grpc-server=grpcio`): grpcio's asyncio server running the same servicer
as Shoal's own HTTP/2 server (docs/grpc.md).

Keepalive flags map one to one onto gRPC core channel arguments (as tritonserver sets them);
messages have no size limit (as in Triton: the HTTP input-size limit is HTTP's); SO_REUSEPORT
is off unless `--reuse-grpc-port`, so a second server on a busy port fails instead of sharing it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from services.gateway.grpc.servicer import GrpcService
from shared.config import triton_protos
from shared.process.settings import GatewaySettings

service_pb2_grpc: Any = triton_protos.load("service_pb2_grpc")


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


class GenericHandlersOnly:
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


async def start(settings: GatewaySettings, service: GrpcService) -> grpc.aio.Server:
    """grpcio's asyncio server, started, serving `service` (raises if the address cannot be bound)."""
    listener = grpc.aio.server(options=channel_options(settings))  # grpc.aio.Server: untyped
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(service, GenericHandlersOnly(listener))
    address = f"{settings.grpc_address}:{settings.grpc_port}"
    creds = credentials(settings)
    port = listener.add_secure_port(address, creds) if creds else listener.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind the gRPC endpoint to {address}")
    await listener.start()
    return listener

"""The gRPC listener with tritonserver's `--grpc-*` settings: Shoal's own HTTP/2 server on the event
loop (services/gateway/grpc/http2/, the default), or grpcio's asyncio server
(`--grpc-server=grpcio`, the fallback: services/gateway/grpc/grpcio_server.py). Both run the same
servicer (services/gateway/grpc/servicer.py).
"""

from __future__ import annotations

from typing import Any, Protocol

from inference.restrictions import CATEGORIES
from inference.server import InferenceServer
from services.gateway.grpc.http2.http2_connection import KeepAlive
from services.gateway.grpc.http2.http2_server import GrpcListener, tls_context
from services.gateway.grpc.servicer import GrpcService, Restrictions
from shared.config import triton_protos
from shared.process.settings import GatewaySettings

service_pb2: Any = triton_protos.load("service_pb2")

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
        stream_unread_bytes=settings.grpc_stream_unread_bytes,
    )
    if settings.grpc_server == "grpcio":
        # the fallback server, imported only when chosen: grpcio's server and its stubs at every start cost CPU
        from services.gateway.grpc import grpcio_server

        started: Listener = await grpcio_server.start(settings, service)
        return started
    listener = GrpcListener(
        service, service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"], service_pb2, keepalive(settings)
    )
    tls = None
    if settings.grpc_use_ssl:
        root = settings.grpc_root_cert or None
        tls = tls_context(settings.grpc_server_cert, settings.grpc_server_key, root, settings.grpc_use_ssl_mutual)
    await listener.start(settings.grpc_address, settings.grpc_port, settings.reuse_grpc_port, tls)
    return listener

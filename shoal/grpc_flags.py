"""`shoal serve`'s gRPC flags, named and defaulted as tritonserver's (docs/grpc.md)."""

from __future__ import annotations

import argparse
from typing import Any

from shared.process import settings as s

# tritonserver's gRPC flags: the gateway's settings of the same names (their defaults and help)
FLAGS = [
    "grpc_address",
    "grpc_port",
    "grpc_keepalive_time",
    "grpc_keepalive_timeout",
    "grpc_http2_max_pings_without_data",
    "grpc_http2_min_recv_ping_interval_without_data",
    "grpc_http2_max_ping_strikes",
    "allow_grpc",
    "grpc_keepalive_permit_without_calls",
    "grpc_use_ssl",
    "grpc_use_ssl_mutual",
    "reuse_grpc_port",
    "grpc_server_cert",
    "grpc_server_key",
    "grpc_root_cert",
    "grpc_infer_response_compression_level",
    "grpc_restricted_protocol",
    "grpc_header_forward_pattern",
    "grpc_server",  # Shoal's own: which server (docs/grpc.md)
]


def add_flags(p: argparse.ArgumentParser) -> None:
    for name in FLAGS:
        s.add_setting(p, "--" + name.replace("_", "-"), s.GatewaySettings, name)


def check(args: argparse.Namespace) -> None:
    from services.gateway.grpc.startup import restrictions

    try:
        restrictions(args.grpc_restricted_protocol)
    except ValueError as exc:
        raise SystemExit(f"shoal serve: {exc}") from None
    if args.grpc_use_ssl and not (args.grpc_server_cert and args.grpc_server_key):
        raise SystemExit("shoal serve: --grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    if args.grpc_use_ssl_mutual and not args.grpc_use_ssl:
        raise SystemExit("shoal serve: --grpc-use-ssl-mutual needs --grpc-use-ssl=true")


def gateway_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The gateway's gRPC settings from the parsed flags."""
    return {name: getattr(args, name) for name in FLAGS}

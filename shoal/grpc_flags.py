"""`shoal serve`'s gRPC flags, named and defaulted as tritonserver's (docs/grpc.md)."""

from __future__ import annotations

import argparse
from typing import Any

from shared import settings as s

_INTS = {
    "--grpc-port": 8001,
    "--grpc-infer-allocation-pool-size": 8,
    "--grpc-keepalive-time": 7_200_000,
    "--grpc-keepalive-timeout": 20_000,
    "--grpc-http2-max-pings-without-data": 2,
    "--grpc-http2-min-recv-ping-interval-without-data": 300_000,
    "--grpc-http2-max-ping-strikes": 2,
}
_BOOLS = {
    "--allow-grpc": True,
    "--grpc-keepalive-permit-without-calls": False,
    "--grpc-use-ssl": False,
    "--grpc-use-ssl-mutual": False,
    "--reuse-grpc-port": False,
}
_PATHS = ("--grpc-server-cert", "--grpc-server-key", "--grpc-root-cert")


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grpc-address", default="0.0.0.0")
    for flag, default in _INTS.items():
        p.add_argument(flag, type=int, default=default)
    for flag, on in _BOOLS.items():
        p.add_argument(flag, type=s.parse_bool, nargs="?", const=True, default=on, metavar="BOOL")
    for flag in _PATHS:
        p.add_argument(flag, default="")
    p.add_argument("--grpc-infer-response-compression-level", choices=["none", "low", "medium", "high"], default="none")
    p.add_argument(
        "--grpc-restricted-protocol", action="append", default=[], help="<protocol>[,<protocol>...]:<key>=<value>"
    )


def check(args: argparse.Namespace) -> None:
    from services.gateway.grpc.server import restrictions

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
    names = ["grpc_address", "grpc_infer_response_compression_level", "grpc_restricted_protocol"]
    names += [_dest(flag) for flag in (*_INTS, *_BOOLS, *_PATHS)]
    return {name: getattr(args, name) for name in names}

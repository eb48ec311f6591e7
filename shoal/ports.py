"""Endpoints whose port is taken, found before anything starts.

tritonserver refuses to start when one of its ports is in use; without this check a gateway
that cannot bind would be restarted by the supervisor again and again until the ready timeout."""

from __future__ import annotations

import argparse
import errno
import socket

from shared.process.natsserver import reserve_ports


def _taken(address: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: TIME_WAIT is not "in use"
        try:
            sock.bind((address, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def endpoints(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(service, address, port) of every endpoint `shoal serve` will open on a fixed port."""
    wanted = []
    if args.allow_http is not False and not args.reuse_http_port:  # SO_REUSEPORT: the port is shared on purpose
        wanted.append(("HTTP", args.http_address, args.http_port))
    if args.allow_grpc and not args.reuse_grpc_port:
        wanted.append(("GRPC", args.grpc_address, args.grpc_port))
    if getattr(args, "allow_sagemaker", False):
        wanted.append(("SageMaker", args.http_address, args.sagemaker_port))
    if getattr(args, "allow_vertex_ai", False):
        wanted.append(("Vertex AI", args.http_address, args.vertex_ai_port))
    if args.allow_metrics:
        wanted.append(("Metrics", args.metrics_address or args.http_address, args.metrics_port))
    if args.openai_port:
        wanted.append(("OpenAI", args.openai_address or args.http_address, args.openai_port))
    return [(name, address, port) for name, address, port in wanted if port]


def busy_endpoint(args: argparse.Namespace) -> str | None:
    """Triton's start-up error for the first endpoint whose port is in use, or None."""
    for name, address, port in endpoints(args):
        if _taken(address, port):
            return f"failed to start {name} service: Unavailable - Socket '{address}:{port}' already in use"
    return None


def reserve_serving_ports(args: argparse.Namespace) -> None:
    """The ports the gateway binds once it starts, kept from this process's own free-port picks
    (nats-server's, before then): the kernel would offer one of them, since nothing binds it yet."""
    reserve_ports(args.http_port, args.grpc_port, args.metrics_port, args.openai_port)

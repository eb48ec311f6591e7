"""The HTTP listening socket, shared with other gateways on the host when asked (SO_REUSEPORT).

With `reuse_http_port` every gateway process binds the same port and the kernel spreads new
connections over them (`shoal serve --gateways N`, tritonserver's `--reuse-http-port`): one
gateway is one event loop, and this is how a host runs several.
"""

from __future__ import annotations

import os
import socket


def http_sockets(address: str, port: int, reuse_port: bool) -> list[socket.socket] | None:
    """A bound socket with SO_REUSEPORT for uvicorn to serve on; None: uvicorn binds on its own."""
    if not reuse_port:
        return None
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((address, port))
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return [sock]


def supervisor_socket(runtime_dir: str, gateway_id: str) -> str:
    """The Unix socket a gateway started with `--allow-http=false` serves its HTTP API on, in
    `shoal serve`'s private runtime directory (0700): its supervisor's readiness checks and log
    settings still reach it while no client can."""
    return os.path.join(runtime_dir, f"http-{gateway_id}.sock")

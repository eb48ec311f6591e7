"""How `shoal serve`'s supervisor calls its gateway's HTTP API (the repository index while it waits
for the models, the logging settings): on the HTTP port, or, with `--allow-http=false` (no HTTP
endpoint, as tritonserver), on the Unix socket the gateway serves in the private runtime
directory instead (`services/gateway/http/listener.py:supervisor_socket`)."""

from __future__ import annotations

import http.client
import socket
from dataclasses import dataclass

# what a call that did not get an answer raises (the gateway not listening yet, a reset)
UNANSWERED = (OSError, http.client.HTTPException)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


@dataclass(frozen=True)
class GatewayHttp:
    port: int
    unix_socket: str = ""  # set: the gateway has no HTTP port, only this socket

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 2.0,
    ) -> tuple[int, bytes]:
        """The status and body of one request; raises one of `UNANSWERED` when none came."""
        if self.unix_socket:
            connection: http.client.HTTPConnection = _UnixConnection(self.unix_socket, timeout)
        else:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

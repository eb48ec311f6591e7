"""docker-compose.swarm.yml run for real: a single-node swarm on this engine, one stack of a name of its
own, its published ports picked free; the stack removed (with its volumes) by the test that made it,
and the swarm left by the fixture that joined it (tests/deploy/test_swarm.py)."""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.process.credentials import write_private
from shared.process.natsserver import free_port
from tests.deploy.compose import ROOT, run
from tests.serving import wait_until

STACK_LABEL = "com.docker.stack.namespace"
SERVICE_LABEL = "com.docker.swarm.service.name"


def swarm_state() -> str:
    return run(["docker", "info", "--format", "{{.Swarm.LocalNodeState}}"]).stdout.strip()


@dataclass
class Stack:
    image: str
    env: dict[str, str] = field(default_factory=dict)
    name: str = field(default_factory=lambda: f"shoalswarm{os.getpid()}{uuid.uuid4().hex[:6]}")
    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    nats_port: int = field(default_factory=free_port)
    nats_monitor_port: int = field(default_factory=free_port)
    _operator: str = ""

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
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    def service(self, name: str) -> str:
        return f"{self.name}_{name}"

    def deploy(self) -> None:
        argv = ["docker", "stack", "deploy", "--resolve-image", "never", "-c", "docker-compose.swarm.yml", self.name]
        run(argv, timeout=300, env=self.environment, cwd=ROOT)

    def scale(self, service: str, replicas: int) -> None:
        run(["docker", "service", "scale", "--detach", f"{self.service(service)}={replicas}"], timeout=120)

    def replicas(self, service: str) -> int:
        inspected = json.loads(run(["docker", "service", "inspect", self.service(service)]).stdout)[0]
        return int(inspected["Spec"]["Mode"]["Replicated"]["Replicas"])

    def containers(self, service: str) -> list[str]:
        """The ids of the service's running containers, oldest first."""
        argv = ["docker", "ps", "-q", "--filter", f"label={SERVICE_LABEL}={self.service(service)}"]
        ids = run(argv).stdout.split()
        created = {c: self.inspect(c)["Created"] for c in ids}
        return sorted(ids, key=lambda c: created[c])

    def inspect(self, container: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(run(["docker", "inspect", container]).stdout)[0]
        return found

    def operator_credentials(self) -> str:
        """The stack's read-only NATS identity and its CA, copied out of its credentials volume."""
        if not self._operator:
            volume = f"{self.name}_credentials"

            def cat(name: str) -> str:
                argv = ["docker", "run", "--rm", "-v", f"{volume}:/c:ro", "--entrypoint", "cat", self.image]
                return run([*argv, f"/c/{name}"], timeout=120).stdout

            path = Path(tempfile.mkdtemp(prefix="shoal-swarm-")) / "operator.nk"
            write_private(path, cat("operator.nk").strip().encode() + b"\n")
            write_private(path.parent / "ca.pem", cat("ca.pem").encode())
            self._operator = str(path)
        return self._operator

    def logs(self, service: str) -> str:
        done = run(["docker", "service", "logs", "--tail", "60", self.service(service)], timeout=60, check=False)
        return done.stdout[-8000:] + done.stderr[-2000:]

    def remove(self) -> None:
        """`docker stack rm`, then its volumes once its containers are gone (the removal is asynchronous)."""
        run(["docker", "stack", "rm", self.name], timeout=120, check=False)
        label = f"label={STACK_LABEL}={self.name}"

        def gone() -> bool:
            left = run(["docker", "ps", "-aq", "--filter", label]).stdout.split()
            left += run(["docker", "network", "ls", "-q", "--filter", label]).stdout.split()
            return not left

        wait_until(gone, 180, f"stack {self.name}'s containers and networks removed", 0.5)
        volumes = run(["docker", "volume", "ls", "-q", "--filter", label]).stdout.split()
        if volumes:
            run(["docker", "volume", "rm", "-f", *volumes], timeout=120)

    def leftovers(self) -> list[str]:
        label = f"label={STACK_LABEL}={self.name}"
        found = []
        for kind in ("ps -a", "volume ls", "network ls", "service ls"):
            listed = run(["docker", *kind.split(), "-q", "--filter", label]).stdout
            found += [f"{kind.split()[0]} {item}" for item in listed.split()]
        return found

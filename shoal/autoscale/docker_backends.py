"""The worker service's replica count, through the Docker Engine API (the `docker` SDK, `pip install
'shoal[deploy]'`): a Swarm service, or a Compose project's service (docs/scaling.md).

Swarm scales a service itself (`docker service scale`): a task removed gets SIGTERM and the
service's stop grace period, which a worker spends draining (services/worker/service.py). Compose
has no API of its own: its containers are the Engine's, labelled with their project, service and
number, so a replica more is a copy of the newest one (its configuration, mounts, networks and
IPC namespace, under the next number, as `docker compose up --scale` makes it), and a replica
fewer is the newest stopped (SIGTERM, then its `stop_grace_period`) and removed. The last one is
stopped and kept: the copy the next replica is made from, started again at the next request.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

log = logging.getLogger("shoal.autoscale")

PROJECT = "com.docker.compose.project"
SERVICE = "com.docker.compose.service"
NUMBER = "com.docker.compose.container-number"
ONEOFF = "com.docker.compose.oneoff"


class Backend(Protocol):
    def replicas(self) -> int: ...  # the replicas running or asked for now
    def scale(self, count: int) -> None: ...
    def describe(self) -> str: ...


def client(base_url: str = "") -> Any:
    try:
        import docker
    except ImportError:
        raise SystemExit("shoal autoscale: needs the docker SDK: pip install 'shoal[deploy]'") from None
    return docker.DockerClient(base_url=base_url) if base_url else docker.from_env()


class SwarmService:
    def __init__(self, docker_client: Any, name: str) -> None:
        self.client = docker_client
        self.name = name

    def _service(self) -> Any:
        return self.client.services.get(self.name)

    def replicas(self) -> int:
        mode = self._service().attrs["Spec"]["Mode"]
        if "Replicated" not in mode:
            raise SystemExit(f"shoal autoscale: swarm service {self.name} is not replicated (mode {list(mode)})")
        return int(mode["Replicated"].get("Replicas", 0))

    def scale(self, count: int) -> None:
        self._service().scale(count)

    def describe(self) -> str:
        return f"swarm service {self.name}"


class ComposeService:
    def __init__(self, docker_client: Any, project: str, service: str) -> None:
        self.client = docker_client
        self.project = project
        self.service = service

    def _containers(self, running: bool) -> list[Any]:
        labels = [f"{PROJECT}={self.project}", f"{SERVICE}={self.service}"]
        found = self.client.containers.list(all=not running, filters={"label": labels})
        found = [c for c in found if c.labels.get(ONEOFF, "False") != "True"]  # not `compose run`'s
        return sorted(found, key=lambda c: int(c.labels.get(NUMBER, "0")))

    def replicas(self) -> int:
        return len(self._containers(running=True))

    def describe(self) -> str:
        return f"compose project {self.project}, service {self.service}"

    def scale(self, count: int) -> None:
        running = self._containers(running=True)
        if count < len(running):
            leaving = running[count:][::-1]  # the newest first
            for container in leaving:
                log.info("stopping %s (it drains first)", container.name)
                container.stop()  # SIGTERM, then the container's StopTimeout (its stop_grace_period)
                if count > 0 or container is not leaving[-1]:
                    container.remove(v=False)
            return
        everything = self._containers(running=False)
        for container in (c for c in everything if c.status != "running"):  # stopped ones first
            if len(running) >= count:
                return
            container.start()
            running.append(container)
        if not everything:
            raise RuntimeError(f"{self.describe()} has no container to copy: `docker compose up` it first")
        numbers = [int(c.labels.get(NUMBER, "0")) for c in everything]
        template = everything[-1]
        for number in range(max(numbers) + 1, max(numbers) + 1 + count - len(running)):
            self._copy(template, number).start()

    def _copy(self, template: Any, number: int) -> Any:
        template.reload()
        config, host = template.attrs["Config"], dict(template.attrs["HostConfig"])
        labels = {**config.get("Labels", {}), NUMBER: str(number)}
        named = template.name.startswith(self.project) and len(template.name) > len(self.project)
        separator = template.name[len(self.project)] if named else "-"  # compose v2's "-", v1's "_"
        name = f"{self.project}{separator}{self.service}{separator}{number}"
        networks = template.attrs["NetworkSettings"]["Networks"]
        first, *others = list(networks) or [None]
        api = self.client.api

        def endpoint(network: str) -> dict[str, Any]:
            return {"Aliases": [self.service]}  # no fixed address of the template's: the network gives one

        created = api.create_container(
            image=config["Image"],
            command=config.get("Cmd"),
            entrypoint=config.get("Entrypoint"),
            environment=config.get("Env"),
            labels=labels,
            working_dir=config.get("WorkingDir") or None,
            user=config.get("User") or None,
            stop_signal=config.get("StopSignal"),
            stop_timeout=config.get("StopTimeout"),
            healthcheck=config.get("Healthcheck"),
            host_config=host,
            name=name,
            networking_config={"EndpointsConfig": {first: endpoint(first)}} if first else None,
        )
        for network in others:
            api.connect_container_to_network(created["Id"], network, aliases=[self.service])
        log.info("created %s", name)
        return self.client.containers.get(created["Id"])

"""The deployment tests' compose fixtures: the compose command, the image built once per module,
and projects taken down (`down -v`, nothing left) after each test."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import yaml

from tests.deploy.compose import Project, compose_command, compose_version, engine_refused, run


@pytest.fixture(scope="module")
def command() -> list[str]:
    refused = engine_refused()
    if refused:
        pytest.skip(refused)
    found = compose_command()
    assert found is not None
    return found


@pytest.fixture(scope="module")
def image(command: list[str]) -> Iterator[str]:
    """The Shoal image, built once for the module with a tag of its own; removed afterwards."""
    tag = f"shoal-deploy-test-{uuid.uuid4().hex[:8]}:cpu"
    project = Project(command, tag)
    # one image for the services that run it, built once: compose v2 builds a `build:` per service
    checked = project.compose("config")
    assert "obsolete" not in checked.stderr, checked.stderr  # compose v2 on a `version:` key
    built = sorted(name for name, service in yaml.safe_load(checked.stdout)["services"].items() if "build" in service)
    assert len(built) == 1, f"{built} each build the image"
    started = time.monotonic()
    project.compose("build", timeout=1800)
    print(f"compose {compose_version(command)}: built {tag} in {time.monotonic() - started:.0f}s")
    yield tag
    run(["docker", "image", "rm", "-f", tag], check=False)


@pytest.fixture
def project(command: list[str], image: str) -> Iterator[Project]:
    made: list[Project] = []

    def make(*files: str, env: dict[str, str] | None = None) -> Project:
        made.append(Project(command, image, list(files) or ["docker-compose.yml"], env or {}))
        return made[-1]

    yield make  # type: ignore[misc]
    for one in made:
        try:
            one.down()
        finally:
            left = one.leftovers()
        assert not left, f"`down -v` left {left}"

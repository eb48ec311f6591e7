"""docker-compose.yml validates without a Docker engine (Debian's docker-compose `config -q`); tests/deploy/
runs it on one."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compose() -> str:
    found = shutil.which("docker-compose")
    if found is None:  # CI installs it; a machine without apt or root skips with the reason
        install = "apt-get install -y -q docker-compose || (apt-get update -q && apt-get install -y -q docker-compose)"
        done = subprocess.run(["bash", "-c", install], capture_output=True, text=True, timeout=600)
        found = shutil.which("docker-compose")
        if found is None:
            pytest.skip(f"docker-compose could not be installed: {done.stderr[-300:]}")
    return found


@pytest.mark.parametrize("files", [["docker-compose.yml"], ["docker-compose.yml", "docker-compose.gpu.yml"]])
def test_compose_files_validate(compose, files):
    args = [compose] + [a for f in files for a in ("-f", str(ROOT / f))]
    checked = subprocess.run(args + ["config", "-q"], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr


def test_compose_runs_every_service_with_health_and_shared_memory(compose):
    out = subprocess.run(
        [compose, "-f", str(ROOT / "docker-compose.yml"), "config"], capture_output=True, text=True, timeout=60
    )
    config = yaml.safe_load(out.stdout)
    services = config["services"]
    assert set(services) == {"shm", "credentials", "nats", "repository", "scheduler", "worker", "gateway"}
    # the NATS identities are made once, before nats starts, and mounted read-only by the services
    assert services["nats"]["depends_on"]["credentials"]["condition"] == "service_completed_successfully"
    # the workers' local channels are reachable at the same path in the gateway (docs/design.md §9)
    channels = services["worker"]["environment"]["SHOAL_WORKER_RUNTIME_DIR"]
    mounts = [
        v if isinstance(v, str) else f"{v.get('source')}:{v.get('target')}" for v in services["gateway"]["volumes"]
    ]
    assert any(f":{channels}" in mount for mount in mounts), mounts
    assert "8222" in str(services["nats"]["ports"]) and "healthcheck" in services["nats"]
    for name in ("repository", "scheduler", "worker", "gateway"):
        assert services[name]["depends_on"]["nats"]["condition"] == "service_healthy"
    # one IPC namespace held by a service that never restarts: a restarted gateway joins it again
    assert services["worker"]["ipc"] == services["gateway"]["ipc"] == "service:shm"
    assert services["shm"]["ipc"] == "shareable"
    assert [name for name, service in services.items() if "build" in service] == ["shm"]  # built once
    assert services["worker"]["deploy"]["replicas"] == 1
    # the scheduler is a container of its own unless the deployment asks the gateways to co-host it
    assert services["gateway"]["command"][-2:] == ["--cohost-scheduler", "false"]

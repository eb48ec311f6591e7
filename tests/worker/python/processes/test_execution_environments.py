"""EXECUTION_ENV_PATH resolution: Triton's $$TRITON_MODEL_DIRECTORY, packed and plain environments."""

from __future__ import annotations

import sys
import tarfile

import pytest

from services.worker.python.processes import execution_environments as envs
from shared.errors import ShoalError

VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"


def env_dir(root, version=VERSION):
    (root / "lib" / version / "site-packages").mkdir(parents=True)
    return root


def test_model_directory_is_substituted():
    params = {"EXECUTION_ENV_PATH": "$$TRITON_MODEL_DIRECTORY/env.tar.gz"}
    assert envs.requested(params, "/models/m") == "/models/m/env.tar.gz"
    assert envs.requested({}, "/models/m") is None


def test_a_packed_environment_is_unpacked_once(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    source = env_dir(tmp_path / "src")
    archive = tmp_path / "env.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source, arcname=".")
    first = envs.prepare(str(archive))
    assert envs.site_packages(first) == first / "lib" / VERSION / "site-packages"
    marker = first / "marker"
    marker.write_text("x")
    assert envs.prepare(str(archive)) == first and marker.exists()  # not unpacked again
    config = {"parameters": {"EXECUTION_ENV_PATH": {"string_value": str(archive)}}}
    environ = envs.process_environ(config, str(tmp_path))
    assert environ[envs.ACTIVE] == str(first)
    assert environ["PYTHONPATH"].split(":")[0] == str(first / "lib" / VERSION / "site-packages")


def test_an_environment_for_another_python_is_refused(tmp_path):
    root = env_dir(tmp_path / "env", "python3.8")
    with pytest.raises(ShoalError) as err:
        envs.site_packages(root)
    assert f"not an environment for {VERSION}" in err.value.message and "python3.8" in err.value.message


def test_the_hosting_process_must_run_in_the_environment(tmp_path, monkeypatch):
    root = env_dir(tmp_path / "env")
    params = {"EXECUTION_ENV_PATH": str(root)}
    monkeypatch.delenv(envs.ACTIVE, raising=False)
    with pytest.raises(ShoalError) as err:
        envs.check(params, str(tmp_path))
    assert "--python-isolation instance or model" in err.value.message
    monkeypatch.setenv(envs.ACTIVE, str(root.resolve()))
    envs.check(params, str(tmp_path))
    with pytest.raises(ShoalError) as err:
        envs.check({"EXECUTION_ENV_PATH": str(tmp_path / "none.tar.gz")}, str(tmp_path))
    assert "does not exist" in err.value.message

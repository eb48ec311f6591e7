"""Triton's per-model python environments (EXECUTION_ENV_PATH): a model written for Triton's
numpy 1.x environment beside one on Shoal's numpy 2.x (issue 16 item 20)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.cluster import running_cluster

NUMPY_1 = "1.26.4"

# np.float_ and np.NINF are gone in numpy 2: Shoal gives them back to python models (numpy_compat)
MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            {body}
            version = np.array([[np.__version__.encode()]] * len(x), dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("VERSION", version), pb_utils.Tensor("Y", y.astype(np.float64))]))
        return responses
"""
PLAIN = "y = x.astype(np.float64)"
REMOVED_NAMES = "y = np.maximum(x.astype(np.float_), np.NINF)  # numpy 1.x names"


def write_model(root: Path, name: str, body: str, env: str | None) -> Path:
    model_dir = root / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(MODEL).replace("{body}", body))
    parameters = f'parameters {{ key: "EXECUTION_ENV_PATH" value {{ string_value: "{env}" }} }}\n' if env else ""
    (model_dir / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "VERSION" data_type: TYPE_STRING dims: [ 1 ] }, '
        '{ name: "Y" data_type: TYPE_FP64 dims: [ 1 ] } ]\n'
        f"instance_group [ {{ count: 1 kind: KIND_CPU }} ]\n{parameters}"
    )
    return model_dir


@pytest.fixture(scope="module")
def numpy1_env(tmp_path_factory) -> Path:
    """A venv of this Python with numpy 1.26 (what Triton's python backend environments ship)."""
    env = tmp_path_factory.mktemp("envs") / "numpy1"
    # without pip of its own, installed into by this Python's pip (--python): the model needs numpy
    # only, and a venv's own pip took 40 s to install on a loaded machine and bloated the packed copy
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=300)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "-q", f"numpy=={NUMPY_1}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        pytest.skip(f"numpy {NUMPY_1} cannot be installed here: {out.stderr.strip().splitlines()[-1:]}")
    return env


@pytest.fixture(scope="module")
def env_cluster(numpy1_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("env_models")
    write_model(root, "numpy_default", PLAIN, None)
    write_model(root, "numpy1_dir", PLAIN, str(numpy1_env))
    packed = write_model(root, "numpy1_packed", REMOVED_NAMES, "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    # the fastest gzip level: a whole venv at level 9 took over 2 minutes on a loaded machine
    with tarfile.open(packed / "env.tar.gz", "w:gz", compresslevel=1) as tar:
        tar.add(numpy1_env, arcname=".")
    write_model(root, "removed_names_default", REMOVED_NAMES, None)  # no environment: numpy 2 with numpy 1 names back
    write_model(root, "missing_env", PLAIN, "$$TRITON_MODEL_DIRECTORY/nowhere.tar.gz")
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(cache))  # the services unpack environments here, not in ~/.cache
        with running_cluster(root) as running:
            yield running, cache


def infer(client: httpclient.InferenceServerClient, model: str) -> tuple[str, np.ndarray]:
    x = httpclient.InferInput("X", [2, 1], "FP32")
    x.set_data_from_numpy(np.array([[1.5], [-2.0]], dtype=np.float32))
    result = client.infer(model, [x])
    return result.as_numpy("VERSION")[0, 0].decode(), result.as_numpy("Y")


def test_models_run_in_their_own_numpy(env_cluster):
    running, cache = env_cluster
    client = httpclient.InferenceServerClient(running.url, network_timeout=120)
    version, _ = infer(client, "numpy_default")
    assert version == np.__version__ and version.startswith("2.")
    version, y = infer(client, "numpy1_dir")
    assert version == NUMPY_1
    np.testing.assert_array_equal(y, [[1.5], [-2.0]])
    version, y = infer(client, "numpy1_packed")  # np.float_, np.NINF work in the 1.26 environment
    assert version == NUMPY_1
    np.testing.assert_array_equal(y, [[1.5], [-2.0]])
    assert len(list((cache / "shoal" / "envs").iterdir())) == 1  # unpacked once, into the cache
    client.close()


def test_numpy1_names_run_unchanged_without_an_environment(env_cluster):
    """Issue 28 item 13: as in Triton's python backend (numpy 1), `np.float_`, `np.NINF` work by
    default: the model's process gets numpy 1's removed names back (numpy_compat)."""
    running, _ = env_cluster
    client = httpclient.InferenceServerClient(running.url, network_timeout=120)
    version, y = infer(client, "removed_names_default")
    assert version == np.__version__ and version.startswith("2.")
    np.testing.assert_array_equal(y, [[1.5], [-2.0]])
    client.close()


def test_a_missing_environment_fails_the_load_with_the_reason(env_cluster):
    running, _ = env_cluster
    client = httpclient.InferenceServerClient(running.url, network_timeout=120)
    entry = next(e for e in client.get_model_repository_index() if e["name"] == "missing_env")
    assert entry["state"] == "UNAVAILABLE"
    assert "EXECUTION_ENV_PATH" in entry["reason"] and "nowhere.tar.gz' does not exist" in entry["reason"]
    client.close()

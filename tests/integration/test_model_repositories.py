"""`--model-repository` given several times, as tritonserver takes it: every repository's models
serve as one set; a name that two repositories hold is neither loaded nor loadable (Triton's log
line, index reason and load error) while the others serve, until it is unique again."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serving import wait_until
from tests.shoal.serving import Serve, one_model_repository, serve

DUPLICATE = "model appears in two or more repositories"
NOT_UNIQUE = "failed to poll model 'shared': not unique across all model repositories"


def two_repositories(root: Path) -> tuple[Path, Path]:
    a = one_model_repository(one_model_repository(root / "a", "alpha"), "shared")
    b = one_model_repository(one_model_repository(root / "b", "beta"), "shared")
    return a, b


@contextlib.contextmanager
def serving(root: Path, *flags: str) -> Iterator[tuple[httpclient.InferenceServerClient, Serve, Path]]:
    """`shoal serve` of the two repositories, started: a client, the server and the second repository."""
    a, b = two_repositories(root / "models")
    with serve(a, root / "cache", f"--model-repository={b}", *flags) as running:
        running.wait_for("Started HTTPService")
        client = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}", network_timeout=120)
        try:
            yield client, running, b
        finally:
            client.close()


def infer(client: httpclient.InferenceServerClient, model: str) -> np.ndarray:
    data = np.array([[1.5, -2.0]], dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer(model, [tensor]).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(result, data)
    return result


def index(client: httpclient.InferenceServerClient) -> dict[str, dict]:
    return {entry["name"]: entry for entry in client.get_model_repository_index()}


def test_every_repository_serves_and_a_duplicate_name_does_not(tmp_path):
    with serving(tmp_path) as (client, running, _):
        infer(client, "alpha")  # from the first repository
        infer(client, "beta")  # from the second
        entries = index(client)
        assert entries["shared"] == {
            "name": "shared",
            "state": "UNAVAILABLE",
            "reason": DUPLICATE,
        }
        assert entries["alpha"]["state"] == entries["beta"]["state"] == "READY"
        assert not client.is_model_ready("shared")
        with pytest.raises(InferenceServerException, match="Request for unknown model: 'shared' is not found"):
            infer(client, "shared")
        assert NOT_UNIQUE in running.output()


def test_poll_mode_follows_a_name_becoming_unique_and_duplicate_again(tmp_path):
    with serving(tmp_path, "--model-control-mode=poll", "--repository-poll-secs=1") as (client, _, b):
        assert index(client)["shared"]["state"] == "UNAVAILABLE"
        shutil.move(b / "shared", tmp_path / "shared")  # now only the first repository holds it
        wait_until(lambda: client.is_model_ready("shared"), 60, "'shared' loaded once unique")
        infer(client, "shared")
        shutil.move(tmp_path / "shared", b / "shared")  # two hold it again: unloaded, as Triton polls
        wait_until(lambda: not client.is_model_ready("shared"), 60, "'shared' unloaded as a duplicate again")
        assert index(client)["shared"]["reason"] == DUPLICATE
        infer(client, "alpha")


def test_explicit_loads_find_a_model_in_any_repository_unless_two_hold_it(tmp_path):
    with serving(tmp_path, "--model-control-mode=explicit", "--load-model=alpha") as (client, running, b):
        infer(client, "alpha")
        assert sorted(index(client)) == ["alpha", "beta", "shared"]
        client.load_model("beta")  # the second repository's
        infer(client, "beta")
        with pytest.raises(InferenceServerException, match="failed to load 'shared', failed to poll from model rep"):
            client.load_model("shared")
        assert NOT_UNIQUE in running.output()
        assert index(client)["shared"]["reason"] == DUPLICATE
        shutil.rmtree(b / "shared")  # unique again: it loads, from the repository that holds it
        client.load_model("shared")
        infer(client, "shared")
        assert index(client)["shared"]["state"] == "READY"
        client.unload_model("beta")
        with pytest.raises(InferenceServerException, match="Request for unknown model: 'beta' has no available"):
            infer(client, "beta")
        with pytest.raises(InferenceServerException, match="failed to load 'missing', failed to poll from model"):
            client.load_model("missing")

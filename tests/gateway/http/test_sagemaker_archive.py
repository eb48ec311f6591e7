"""SageMaker's multi-model load plan (services/gateway/http/sagemaker_archive.py): which directory
is the model, which is the repository SageMaker lists, and the load parameters sent for each."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from services.gateway.http import sagemaker_archive as archive

CONFIG = 'name: "addsub"\nbackend: "python"\nmax_batch_size: 8\n'


def model(directory: Path, config: str = CONFIG) -> Path:
    (directory / "1").mkdir(parents=True)
    (directory / "1" / "model.py").write_text("# the model\n")
    (directory / "config.pbtxt").write_text(config)
    return directory


def test_a_url_holding_a_config_is_the_model_and_its_parent_the_repository(tmp_path):
    url = model(tmp_path / "hash" / "model")
    plan = archive.plan(str(url) + "/", "sm_model")
    assert plan.repository == str(tmp_path / "hash")
    [(name, parameters)] = plan.loads
    assert name == "sm_model"
    assert json.loads(parameters["config"]) == {"name": "sm_model", "backend": "python", "max_batch_size": 8}
    assert base64.b64decode(parameters["file:1/model.py"]) == b"# the model\n"
    assert set(parameters) == {"config", "file:1/model.py"}  # config.pbtxt travels as the config


def test_a_repository_url_loads_its_ensemble_last_under_the_target_name(tmp_path):
    url = tmp_path / "hash" / "model"
    model(url / "addsub")
    model(url / "zz_fan", 'name: "zz_fan"\nplatform:  "ensemble"\n')
    model(url / "sub", 'name: "sub"\nbackend: "python"\n')
    plan = archive.plan(str(url), "target")
    assert plan.repository == str(url)
    assert [name for name, _ in plan.loads] == ["addsub", "sub", "target"]
    assert json.loads(plan.loads[-1][1]["config"])["platform"] == "ensemble"
    (url / "zz_fan" / "1" / "model.py").unlink()  # an ensemble's version directory is empty
    assert archive.files(url / "zz_fan") == {"file:1/.keep": ""}


def test_without_an_ensemble_the_last_subdirectory_is_the_model(tmp_path):
    model(tmp_path / "a")
    model(tmp_path / "b")
    assert [name for name, _ in archive.plan(str(tmp_path), "t").loads] == ["a", "t"]


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_no_repository_there_is_tritons_register_error(tmp_path, where):
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        archive.RepositoryNotFound, match=f"failed to register '{tmp_path / where}', repository not found"
    ):
        archive.plan(str(tmp_path / where), "t")


@pytest.mark.parametrize(
    "url, refused", [("/proc/self", True), ("/dev/shm/x", True), ("/sys/../sys/x", True), ("/devices", False)]
)
def test_dev_proc_and_sys_are_refused_after_normalising(url, refused):
    assert archive.forbidden(url) is refused


@pytest.mark.parametrize(
    "url, valid",
    [
        ("/opt/ml/models/abc123/model", True),
        ("/opt/ml/models/abc123/model/", True),
        ("/opt/ml/models/abc123/model/sub_dir.1", True),
        ("/opt/ml/models/x/../abc/model", True),  # normalised first, as tritonserver's absolute()
        ("/", False),
        ("/etc", False),
        ("/opt/ml/models/abc123", False),
        ("/opt/ml/models/abc123/other", False),
        ("/opt/ml/models/abc123/model/a/b", False),
        ("/opt/ml/models/abc123/model/../../../../etc", False),
        ("relative/model", False),
    ],
)
def test_only_sagemakers_model_directories_may_be_named(url, valid):
    refusal = archive.invalid(url)
    assert (refusal is None) is valid
    if not valid:
        assert refusal == f"Invalid \"url\" '{url}': expected a path of the form /opt/ml/models/<hash>/model[/<subdir>]"


def test_another_root_is_the_one_allowed(tmp_path):
    assert archive.invalid(str(tmp_path / "h" / "model"), str(tmp_path)) is None
    assert archive.invalid("/opt/ml/models/h/model", str(tmp_path)) is not None


def test_a_link_out_of_the_model_directory_is_refused(tmp_path):
    url = model(tmp_path / "hash" / "model")
    (url / "1" / "secret").symlink_to("/etc/hostname")
    with pytest.raises(archive.Refused, match="leads out of the model's directory"):
        archive.plan(str(url), "t")


def test_more_bytes_than_a_request_may_carry_are_refused(tmp_path):
    url = model(tmp_path / "hash" / "model")
    (url / "1" / "weights.bin").write_bytes(bytes(4096))
    with pytest.raises(archive.Refused, match="larger than the 1000 bytes"):
        archive.plan(str(url), "t", limit=1000)
    assert archive.plan(str(url), "t", limit=1 << 20).loads  # within the limit: loaded

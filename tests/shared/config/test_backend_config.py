"""`--backend-config` as tritonserver parses it, and where python-based backends are found."""

from __future__ import annotations

import pytest

from shared.config import backend_config as bc


def test_parse_per_backend_and_global_settings():
    config = bc.parse(
        ["python,shm-default-byte-size=4194304", "default-max-batch-size=16", "dali,release_after_unload=true"]
    )
    assert config == {
        "python": {"shm-default-byte-size": "4194304"},
        "": {"default-max-batch-size": "16"},
        "dali": {"release_after_unload": "true"},
    }
    assert bc.settings_for(config, "python") == {"default-max-batch-size": "16", "shm-default-byte-size": "4194304"}
    assert bc.default_max_batch_size(config, "onnxruntime") == 16
    assert bc.default_max_batch_size({}, "onnxruntime") == 4
    assert bc.parse_option("a,b=c=d") == ("a", "b", "c=d")  # the value keeps what follows the first '='


@pytest.mark.parametrize(
    "entry, message",
    [
        (",x=1", "No backend specified. --backend-config option format is"),
        ("python,x", "--backend-config option format is '<backend name>,<setting>=<value>'. Got python,x"),
        ("python,=1", "Got python,=1"),
        ("python,x=", "Got python,x="),
    ],
)
def test_bad_options_are_tritonservers_errors(entry, message):
    with pytest.raises(ValueError, match=message):
        bc.parse([entry])


def test_python_based_backends_and_shared_libraries_are_found_in_the_directory(tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "model.py").write_text("class TritonPythonModel: pass\n")
    (tmp_path / "custom").mkdir()
    (tmp_path / "custom" / "libtriton_custom.so").write_bytes(b"")
    assert bc.python_based_runtime(str(tmp_path), "vllm") == tmp_path / "vllm" / "model.py"
    assert bc.python_based_runtime(str(tmp_path), "custom") is None
    assert bc.python_based_runtime(str(tmp_path), "python") is None  # built in wins
    assert bc.python_based_runtime(str(tmp_path), "../vllm") is None
    assert bc.shared_library(str(tmp_path), "custom") == tmp_path / "custom" / "libtriton_custom.so"


def test_settings_no_backend_reads():
    assert bc.unread({"enable-global-threadpool": "1", "default-max-batch-size": "8"}, "onnxruntime", False) == [
        "enable-global-threadpool"
    ]
    assert bc.unread({"stub-timeout-seconds": "30"}, "vllm", True) == []
    assert bc.unread({"release_after_unload": "true"}, "dali", False) == []

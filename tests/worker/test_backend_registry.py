"""Which backend serves a config's `backend`: built in, python-based in the backend directory,
or an error saying what was looked for."""

from __future__ import annotations

import pytest

from services.worker.backends import load_backend
from shared.errors import ShoalError


def test_a_name_found_nowhere_says_where_it_looked(tmp_path):
    with pytest.raises(ShoalError) as caught:
        load_backend("nowhere", str(tmp_path))
    assert caught.value.message == (
        f"backend 'nowhere' is not supported by this Shoal worker; no python-based backend {tmp_path}/nowhere/model.py either"
    )


def test_a_cpp_backend_is_refused_with_the_reason(tmp_path):
    (tmp_path / "custom").mkdir()
    (tmp_path / "custom" / "libtriton_custom.so").write_bytes(b"\x7fELF")
    with pytest.raises(ShoalError, match="is a C\\+\\+ backend .* which Shoal cannot load"):
        load_backend("custom", str(tmp_path))


def test_a_python_based_backend_is_a_python_instance_factory(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    backend = load_backend("mine", str(tmp_path))
    assert backend.default_file == ""  # it gets the model's version directory, not a file of it


@pytest.mark.parametrize("name", ["identity", "repeat", "square", "fil", "openvino", "dali"])
def test_the_new_built_in_backends_import(name):
    assert load_backend(name) is not None

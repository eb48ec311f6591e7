from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.config.lora_adapters import lora_adapters, served_names


def test_no_declaration_is_no_adapters():
    assert lora_adapters({}) == {} and lora_adapters({"lora_adapters": "  "}) == {}
    assert served_names("m", {}) == {}


@given(st.dictionaries(st.text(min_size=1), st.text(min_size=1), max_size=5))
def test_a_json_object_of_names_to_files_is_read_back_as_written(declared):
    parameters = {"lora_adapters": json.dumps(declared)}
    assert lora_adapters(parameters) == declared
    assert served_names("m", parameters) == {f"m_lora_{name}": name for name in declared}


@pytest.mark.parametrize("text", ["{", "[]", '{"a": 1}', '{"": "x.gguf"}', '{"a": ""}', '"a"'])
def test_anything_else_is_refused_saying_what_it_must_be(text):
    with pytest.raises(ValueError, match="lora_adapters"):
        lora_adapters({"lora_adapters": text})
    assert served_names("m", {"lora_adapters": text}) == {}

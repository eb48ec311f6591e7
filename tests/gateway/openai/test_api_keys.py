"""services/gateway/openai/api_keys.py: which Authorization headers pass, OpenAI's 401 for the
rest, and key files read as documented (comments, several keys, clear errors that name no key)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.gateway.openai.api_keys import ApiKeys
from services.gateway.openai.openai_errors import OpenAIError


def refusal(keys: ApiKeys, header: str | None) -> OpenAIError:
    with pytest.raises(OpenAIError) as raised:
        keys.check(header)
    return raised.value


def test_no_key_set_lets_everyone_in():
    keys = ApiKeys([])
    assert not keys.required
    keys.check(None)
    keys.check("Bearer anything")


def test_the_key_passes_and_anything_else_is_openais_401():
    keys = ApiKeys(["sk-right"])
    keys.check("Bearer sk-right")
    keys.check("bearer  sk-right ")  # the scheme is case-insensitive; spaces around the key are not part of it
    missing = refusal(keys, None)
    assert missing.status == 401 and missing.code is None and "didn't provide an API key" in missing.message
    assert refusal(keys, "Basic sk-right").code is None  # not Bearer auth: no key given
    assert refusal(keys, "Bearer ").code is None
    wrong = refusal(keys, "Bearer sk-wrong")
    assert wrong.status == 401 and wrong.code == "invalid_api_key"
    assert "sk-wrong" not in wrong.message  # never echoed
    assert wrong.document()["error"]["type"] == "invalid_request_error"


@given(st.text(min_size=1).filter(lambda t: t.strip() and t.strip() != "sk-right"))
def test_no_other_key_passes(other: str):
    with pytest.raises(OpenAIError):
        ApiKeys(["sk-right"]).check(f"Bearer {other}")


def test_a_key_file_holds_one_key_a_line_with_comments(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# rotated on Monday\nsk-old\n\n  sk-new  \n")
    keys = ApiKeys.load("sk-env", str(path))
    for key in ("sk-old", "sk-new", "sk-env"):
        keys.check(f"Bearer {key}")
    assert refusal(keys, "Bearer # rotated on Monday").code == "invalid_api_key"


def test_an_unreadable_or_empty_key_file_is_a_clear_error_that_names_no_key(tmp_path):
    with pytest.raises(ValueError, match="cannot read --openai-api-key-file .*none"):
        ApiKeys.load("sk-secret", str(tmp_path / "none"))
    empty = tmp_path / "empty"
    empty.write_text("# nothing yet\n\n")
    with pytest.raises(ValueError, match="holds no key") as raised:
        ApiKeys.load("sk-secret", str(empty))
    assert "sk-secret" not in str(raised.value)

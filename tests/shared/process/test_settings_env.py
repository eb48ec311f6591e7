"""The settings' environment variables (shared/process/settings_env.py): what pydantic-settings read
for Shoal, read without it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal, get_args, get_origin

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import Field, SecretStr, ValidationError

from shared.process.settings import GatewaySettings, RepositorySettings, SchedulerSettings, WorkerSettings
from shared.process.settings_env import (
    BaseSettings,
    EnvironmentValueError,
    NoDecode,
    SettingsConfigDict,
    environment_values,
)

MODELS: list[type[BaseSettings]] = [GatewaySettings, SchedulerSettings, WorkerSettings, RepositorySettings]
FIELDS = [(model, name) for model in MODELS for name in model.model_fields]
# what an environment variable can hold: no NUL, no lone surrogates
TEXT = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), max_size=20)
BOOL_SPELLINGS = {True: ["true", "True", "1", "on", "YES"], False: ["false", "FALSE", "0", "off", "no"]}


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """os.environ with `values` set, as it was afterwards (hypothesis runs many examples per test)."""
    saved = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _value_and_text(annotation: Any) -> st.SearchStrategy[tuple[Any, str]]:
    """A value of a field's type and its variable's text (JSON for a list)."""
    if annotation is bool:
        return st.booleans().flatmap(lambda b: st.sampled_from(BOOL_SPELLINGS[b]).map(lambda text: (b, text)))
    if annotation is int:
        return st.integers().map(lambda i: (i, str(i)))
    if annotation is float:
        return st.floats(allow_nan=False).map(lambda f: (f, repr(f)))
    if annotation is SecretStr:
        return TEXT.map(lambda text: (SecretStr(text), text))
    if get_origin(annotation) is Literal:
        return st.sampled_from(get_args(annotation)).map(lambda choice: (choice, choice))
    if get_origin(annotation) is list:
        return st.lists(TEXT, max_size=3).map(lambda items: (items, json.dumps(items)))
    assert annotation is str, annotation
    return TEXT.map(lambda text: (text, text))


def _outcome(make: Any, name: str) -> Any:
    """A field's value once validated, or the validation error's type and place."""
    try:
        value = getattr(make(), name)
    except ValidationError as exc:
        return [(e["type"], e["loc"]) for e in exc.errors()]
    return value.get_secret_value() if isinstance(value, SecretStr) else value


@pytest.mark.parametrize(("model", "name"), FIELDS, ids=[f"{m.__name__}.{n}" for m, n in FIELDS])
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_any_value_of_a_field_reads_from_its_variable_as_given_to_the_constructor(
    model: type[BaseSettings], name: str, data: st.DataObject
) -> None:
    info = model.model_fields[name]
    if NoDecode in info.metadata:  # model_repository: its variable is one path, not JSON
        value, text = data.draw(TEXT.map(lambda path: ([path], path)))
    else:
        value, text = data.draw(_value_and_text(info.annotation))
    variable = data.draw(
        st.sampled_from(
            [model.model_config["env_prefix"] + name.upper(), (model.model_config["env_prefix"] + name).lower()]
        )
    )
    with environment({variable: text}):
        # the same value, the same validation (e.g. an unknown memory budget fails both ways)
        assert _outcome(model, name) == _outcome(lambda: model(**{name: value}), name)


def test_the_constructor_wins_over_the_environment_which_wins_over_the_default() -> None:
    assert GatewaySettings().http_port == 8000
    with environment({"SHOAL_GATEWAY_HTTP_PORT": "9000"}):
        assert GatewaySettings().http_port == 9000
        assert GatewaySettings(http_port=9100).http_port == 9100


def test_each_service_reads_only_its_own_prefix() -> None:
    with environment({"SHOAL_SCHEDULER_NATS_URL": "nats://elsewhere:4222", "NATS_URL": "nats://bare:4222"}):
        assert SchedulerSettings().nats_url == "nats://elsewhere:4222"
        assert GatewaySettings().nats_url == "nats://127.0.0.1:4222"


def test_a_list_variable_is_json_unless_the_field_says_not() -> None:
    with environment({"SHOAL_WORKER_MODELS": '["simple","mlp*"]', "SHOAL_REPOSITORY_MODEL_REPOSITORY": '["a"]'}):
        assert WorkerSettings().models == ["simple", "mlp*"]
        assert RepositorySettings().model_repository == ['["a"]']  # one path, whatever it looks like


def test_a_list_variable_that_is_not_json_is_refused_with_its_name() -> None:
    with environment({"SHOAL_WORKER_MODELS": "simple"}):
        with pytest.raises(EnvironmentValueError, match="SHOAL_WORKER_MODELS is not JSON"):
            WorkerSettings()
        with pytest.raises(EnvironmentValueError):  # read even where the constructor is given the field
            WorkerSettings(models=["simple"])


def test_a_bad_value_is_pydantics_validation_error_on_that_field() -> None:
    with environment({"SHOAL_SCHEDULER_HEALTH_PORT": "eighty"}):
        with pytest.raises(ValidationError) as caught:
            SchedulerSettings()
    assert [(e["type"], e["loc"]) for e in caught.value.errors()] == [("int_parsing", ("health_port",))]


def test_validators_run_on_values_from_the_environment_and_on_defaults() -> None:
    with environment({"SHOAL_WORKER_PYTHON_ISOLATION": "process"}):
        assert WorkerSettings().python_isolation == "model"  # the older name
    with environment({"SHOAL_WORKER_MODEL_LOAD_THREAD_COUNT": "0"}), pytest.raises(ValidationError):
        WorkerSettings()


def test_an_unknown_setting_is_refused_from_the_constructor_and_ignored_in_the_environment() -> None:
    with pytest.raises(ValidationError):
        GatewaySettings(no_such_setting=1)
    with environment({"SHOAL_GATEWAY_NO_SUCH_SETTING": "1"}):
        GatewaySettings()


def test_validating_reads_the_environment_and_copying_does_not() -> None:
    settings = GatewaySettings()
    with environment({"SHOAL_GATEWAY_HTTP_PORT": "9000"}):
        assert settings.model_copy().http_port == 8000
        assert GatewaySettings.model_validate({}).http_port == 9000  # pydantic validates through __init__


class _Shapes(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SHAPES_")
    pairs: dict[str, int] = Field(default_factory=dict)
    either: list[int] | str = ""
    word: Annotated[str, "not a marker"] = ""


def test_dicts_are_json_and_a_union_with_a_list_keeps_text_that_is_not_json() -> None:
    environ = {"SHAPES_PAIRS": '{"a": 1}', "SHAPES_EITHER": "text", "SHAPES_WORD": "[1]"}
    assert environment_values(_Shapes, environ) == {"pairs": {"a": 1}, "either": "text", "word": "[1]"}
    assert environment_values(_Shapes, {"SHAPES_EITHER": "[1, 2]"}) == {"either": [1, 2]}

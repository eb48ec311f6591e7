"""Settings models that read their environment variables themselves (SHOAL_<SERVICE>_<FIELD>).

This is what pydantic-settings' `BaseSettings` did for Shoal, without importing it: its import
alone cost every service process 0.7-0.8 s of CPU before it served (docs/performance.md,
"Start-up"), and Shoal used only its environment source. The same rules:

- a value given to the constructor wins over the environment, which wins over the default;
- the variable is `model_config["env_prefix"]` + the field's name, in any case (`shoal_gateway_http_port` too);
- a list, tuple, set, dict or model field's variable is JSON (`SHOAL_WORKER_MODELS='["a","b*"]'`),
  unless the field is `Annotated[..., NoDecode]`: then its text is validated as it is;
- everything else is the variable's text, validated by the field's type (pydantic's errors).

The constructor reads the environment (and so `model_validate`, which pydantic runs through an overridden `__init__`); `model_copy` does not: as before.
"""

from __future__ import annotations

import json
import os
import types
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo

_CONTAINERS = (list, tuple, set, frozenset, deque, dict, Mapping, Sequence)


class NoDecode:
    """`Annotated[list[str], NoDecode]`: this field's variable is text, not JSON (a validator reads it)."""


class EnvironmentValueError(ValueError):
    """A JSON variable that is not JSON (pydantic-settings raised its SettingsError, a ValueError too)."""


class SettingsConfigDict(ConfigDict, total=False):
    """pydantic's model config with the variables' prefix (`model_config["env_prefix"]`, as before)."""

    env_prefix: str


class BaseSettings(BaseModel):
    """A settings model whose constructor fills the fields it is not given from the environment."""

    # pydantic-settings' defaults: an unknown setting is an error, and defaults are validated too
    model_config = SettingsConfigDict(extra="forbid", validate_default=True, env_prefix="")

    def __init__(self, **values: Any) -> None:
        super().__init__(**{**environment_values(type(self)), **values})


def _decoding(annotation: Any) -> tuple[bool, bool]:
    """(JSON-decoded, kept as text where it is not JSON): containers are JSON; a union with one is JSON
    where it parses (pydantic-settings' rule)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _decoding(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return any(_decoding(arg)[0] for arg in get_args(annotation)), True
    kind = origin or annotation
    if isinstance(kind, type) and not issubclass(kind, (str, bytes)):
        return issubclass(kind, (*_CONTAINERS, BaseModel)), False
    return False, False


def _value(variable: str, info: FieldInfo, text: str) -> Any:
    json_decoded, lenient = _decoding(info.annotation)
    if not json_decoded or NoDecode in info.metadata:
        return text
    try:
        return json.loads(text)
    except ValueError as exc:
        if lenient:
            return text
        raise EnvironmentValueError(f"{variable} is not JSON, which its setting expects: {exc}") from exc


def environment_values(model: type[BaseSettings], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The fields of `model` that the environment sets, by name, decoded (not yet validated)."""
    prefix = model.model_config["env_prefix"]
    lowered = {key.lower(): text for key, text in (os.environ if environ is None else environ).items()}
    values: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        variable = (prefix + name).lower()
        if variable in lowered:
            values[name] = _value(variable.upper(), info, lowered[variable])
    return values

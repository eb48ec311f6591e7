"""Settings as command-line flags: argparse options built from a settings model's fields, their
one line of `--help`, and a settings object turned back into flags (`to_argv`), so that `shoal
serve` starts each child service with exactly the settings it resolved."""

from __future__ import annotations

import argparse
from typing import Any, Literal, get_args, get_origin

from pydantic.fields import FieldInfo

from shared.process.settings_env import BaseSettings

TRUE = {"true", "on", "1", "yes"}
FALSE = {"false", "off", "0", "no"}


def parse_bool(value: str) -> bool:
    """tritonserver's boolean flag values: true/false/on/off/1/0, any case."""
    lowered = value.strip().lower()
    if lowered in TRUE:
        return True
    if lowered in FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean value '{value}' (use true/false/on/off/1/0)")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def shown_default(info: FieldInfo) -> str:
    """A field's default as `--help` shows it: tritonserver's spelling for booleans, `none` for nothing."""
    extra = info.json_schema_extra
    if isinstance(extra, dict) and "shown" in extra:
        return str(extra["shown"])
    value = info.get_default(call_default_factory=True)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value in ("", [], None):
        return "none"
    return str(value)


def help_text(info: FieldInfo) -> str:
    """The one line of `--help` for a setting: its description and its default."""
    return f"{info.description} (default: {shown_default(info)})".replace("%", "%%")


def option_kwargs(info: FieldInfo) -> dict[str, Any]:
    """argparse keywords for a setting: type, choices, help (the default stays the caller's)."""
    kwargs: dict[str, Any] = {"help": help_text(info)}
    annotation = info.annotation
    if annotation is bool:
        kwargs.update(type=parse_bool, metavar="BOOL")
    elif annotation in (int, float):
        kwargs["type"] = annotation
    elif get_origin(annotation) is Literal:
        kwargs.update(choices=list(get_args(annotation)), type=str.lower)
    elif get_origin(annotation) is list:
        kwargs["action"] = "append"
    return kwargs


def add_setting(
    parser: argparse.ArgumentParser, flag: str, model: type[BaseSettings], field: str, **extra: Any
) -> None:
    """A flag for one setting under a name of its own (tritonserver's), with the setting's default and help."""
    info = model.model_fields[field]
    kwargs = {**option_kwargs(info), "default": info.get_default(call_default_factory=True), **extra}
    if info.annotation is bool:
        kwargs.update(nargs="?", const=True)  # `--flag` alone is true, as tritonserver
    parser.add_argument(flag, **kwargs)


def add_arguments(parser: argparse.ArgumentParser, model: type[BaseSettings]) -> None:
    """One `--kebab-case` option per field; unset options fall back to env and defaults."""
    for name, info in model.model_fields.items():
        parser.add_argument(_flag(name), dest=name, default=argparse.SUPPRESS, **option_kwargs(info))


def from_namespace(model: type[BaseSettings], namespace: argparse.Namespace) -> Any:
    given = {k: v for k, v in vars(namespace).items() if k in model.model_fields}
    return model(**given)


def to_argv(settings: BaseSettings) -> list[str]:
    argv: list[str] = []
    for name, value in settings.model_dump().items():
        if isinstance(value, list):
            for item in value:
                argv += [_flag(name), str(item)]
        elif isinstance(value, bool):
            argv += [_flag(name), "true" if value else "false"]
        else:
            argv += [_flag(name), str(value)]
    return argv

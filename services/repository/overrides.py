"""Triton's load overrides: a `config` JSON and `file:<version>/<path>` contents.

With files the override replaces the model directory: a temporary directory holding
exactly the given files, each written only inside it.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from shared.config.paths import inside
from shared.errors import ShoalError, internal, invalid
from shared.process import scratch

log = logging.getLogger("shoal.repository")


def poll_failed(name: str, reason: str) -> ShoalError:
    """A load whose overrides cannot be read or written: Triton's answer, the reason logged.

    Triton answers every such failure "failed to load '<m>', failed to poll from model repository"
    (INTERNAL, 500) and keeps the reason for its log; so does Shoal (docs/compatibility.md,
    issue 28 item 4: Shoal answered 400 with the reason until clients' checks of the status won).
    """
    log.error("failed to load '%s', failed to poll from model repository: %s", name, reason)
    return internal(f"failed to load '{name}', failed to poll from model repository")


def write_override_dir(name: str, files: dict[str, bytes]) -> Path:
    root = scratch.make("shoal-override-", name)
    model_dir = root / name
    model_dir.mkdir()
    try:
        for relative, content in files.items():
            _write_file(model_dir, relative, content)
    except Exception:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return model_dir


def _write_file(model_dir: Path, relative: str, content: bytes) -> None:
    """One override file; file system refusals (a name too long, ...) in Triton's words."""
    target = inside(model_dir, relative)
    base = model_dir.resolve()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        failed = Path(exc.filename or target.parent)
        shown = failed.relative_to(base) if failed.is_relative_to(base) else target.parent.relative_to(base)
        raise invalid(f"Failed to create directory '{shown}', errno:{exc.strerror}") from None
    try:
        target.write_bytes(content)
    except OSError as exc:
        raise invalid(f"failed to open binary file for write {target.relative_to(base)}: {exc.strerror}") from None


def remove_override_dir(model_dir: Path) -> None:
    shutil.rmtree(model_dir.parent, ignore_errors=True)


def check_parameters(parameters: dict[str, object]) -> tuple[str, dict[str, str]]:
    """Split the load request's parameters into the config override and the files."""
    config, files = "", {}
    for key, value in parameters.items():
        if key == "config":
            if not isinstance(value, str):
                raise invalid("Invalid config override: 'config' must be a JSON string")
            config = value
        elif key.startswith("file:"):
            if not isinstance(value, str):
                raise invalid(f"file override '{key}' must be a base64 string")
            files[key[len("file:") :]] = value
        else:
            raise invalid(f"Unrecognized load parameter '{key}'.")
    if files and not config:
        raise invalid("failed to load model: file override requires a 'config' override")
    return config, files

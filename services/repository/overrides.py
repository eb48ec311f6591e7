"""Triton's load overrides: a `config` JSON and `file:<version>/<path>` contents.

With files the override replaces the model directory: a temporary directory holding
exactly the given files, each written only inside it.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from shared.errors import invalid
from shared.paths import inside


def write_override_dir(name: str, files: dict[str, bytes]) -> Path:
    root = Path(tempfile.mkdtemp(prefix=f"shoal-override-{name}-"))
    model_dir = root / name
    model_dir.mkdir()
    try:
        for relative, content in files.items():
            target = inside(model_dir, relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
    except Exception:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return model_dir


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

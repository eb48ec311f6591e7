"""Repository agents run on a model's files before it loads. Shoal has Triton's `checksum`."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from shared.config.paths import inside
from shared.errors import invalid


def run_agents(config: dict[str, Any], model_dir: Path) -> None:
    for agent in config.get("model_repository_agents", {}).get("agents", []):
        name = agent.get("name", "")
        if name != "checksum":
            raise invalid(f"unknown repository agent '{name}' (Shoal supports: checksum)")
        checksum(agent.get("parameters", {}), model_dir)


def checksum(parameters: dict[str, str], model_dir: Path) -> None:
    """Parameters `MD5:<file relative to the model directory>` -> expected hex digest."""
    for key, expected in parameters.items():
        algorithm, _, relative = key.partition(":")
        if algorithm.upper() != "MD5" or not relative:
            raise invalid(f"checksum agent: unsupported parameter '{key}' (expected 'MD5:<file>')")
        path = inside(model_dir, relative)
        if not path.is_file():
            raise invalid(f"checksum agent: file '{relative}' does not exist")
        actual = hashlib.md5(path.read_bytes()).hexdigest()
        if actual.lower() != expected.strip().lower():
            raise invalid(f"checksum agent: MD5 of '{relative}' is {actual}, expected {expected.strip()}")

"""Reading one model directory: versions, version policy and the normalized config."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.repository.agents import run_agents
from services.repository.autocomplete import AutoComplete, complete, config_path
from shared.config import model_config, triton_protos
from shared.config.paths import inside
from shared.errors import invalid

pb: Any = triton_protos.load("model_config_pb2")


@dataclass
class ScannedModel:
    name: str
    path: Path
    config: pb.ModelConfig | None  # None when the config failed to load
    versions: list[int]  # versions the policy selects
    error: str = ""


def list_models(repository: Path) -> list[str]:
    return sorted(p.name for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))


def check_model_name(name: str) -> None:
    """A model name is one directory name: nothing that could lead out of the repository."""
    if not name or "/" in name or "\\" in name or name in (".", "..") or name.startswith(".") or "\0" in name:
        raise invalid(f"invalid model name '{name}'")


def version_dirs(model_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) > 0)


def select_versions(config: pb.ModelConfig, available: list[int]) -> list[int]:
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return list(available)
    if which == "specific":
        return sorted(v for v in set(policy.specific.versions) if v in available)
    count = policy.latest.num_versions if which == "latest" else 1
    return sorted(available)[-max(count, 1) :] if available else []


def load_config(
    model_dir: Path,
    versions: list[int],
    auto_complete: AutoComplete | None = None,
    override: pb.ModelConfig | None = None,
) -> pb.ModelConfig:
    auto_complete = auto_complete or AutoComplete()
    # a symlink may point elsewhere in the repository, never out of it
    chosen = config_path(model_dir, auto_complete.config_name)
    path = inside(model_dir.parent, str(chosen.relative_to(model_dir.parent)))
    if override is not None:
        config = override
    elif path.exists():
        config = model_config.parse_text(model_config.read_text(path), path)
    elif auto_complete.enabled:
        config = pb.ModelConfig()
    else:
        raise invalid(f"failed to open text file for read {path}: No such file or directory")
    if config.name and config.name != model_dir.name:
        raise invalid(
            f"unexpected directory name '{model_dir.name}' for model '{config.name}', "
            "directory name must equal model name"
        )
    model_config.autofill_backend(config, model_dir, versions)
    if auto_complete.enabled and versions:
        config = complete(config, model_dir, max(versions), auto_complete)
    model_config.normalize(config)
    model_config.validate(config)
    return config


def scan_model(
    model_dir: Path, auto_complete: AutoComplete | None = None, override: pb.ModelConfig | None = None
) -> ScannedModel:
    available = version_dirs(model_dir)
    try:
        config = load_config(model_dir, available, auto_complete, override)
        run_agents(model_config.to_json(config), model_dir)
    except Exception as exc:  # a bad model is UNAVAILABLE; the others still load
        return ScannedModel(
            model_dir.name, model_dir, None, available[-1:], model_config.load_error(model_dir.name, exc)
        )
    return ScannedModel(model_dir.name, model_dir, config, select_versions(config, available))


def signature(model_dir: Path) -> str:
    """Changes when the config or any file of the model changes (poll mode's reload trigger)."""
    digest = hashlib.sha1()
    for folder, dirs, files in sorted(os.walk(model_dir)):  # does not follow symlinked folders
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(f for f in files if not f.startswith(".")):
            path = Path(folder) / name
            try:
                stat = path.stat()
            except OSError:
                continue
            digest.update(f"{path.relative_to(model_dir)}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()

"""Triton's per-model python environments: `parameters { key: "EXECUTION_ENV_PATH" ... }`.

The value is a packed environment (`.tar.gz`/`.tgz`, as conda-pack or `tar czf` of a venv
make it) or a plain one (a directory), with `$$TRITON_MODEL_DIRECTORY` standing for the model's
directory. A packed one is unpacked once into Shoal's cache (`~/.cache/shoal/envs/`), keyed by
the archive's path, size and modification time.

How a model runs in it: its worker process (`isolation.py`, one per python model) is Shoal's
own interpreter with the environment's `lib/pythonX.Y/site-packages` first on `sys.path`
(PYTHONPATH), so the model's imports (numpy 1.26 for a model written for Triton's environment,
say) come from the environment and the rest from Shoal's installation. The environment must
be for Shoal's Python version: site-packages of another Python cannot be imported. Shoal itself
runs on numpy 1.26 and 2.x for this reason. A package of the environment that Shoal also uses
(protobuf, msgspec, ...) is the environment's too: keep such environments to the model's needs.

The process hosting the model checks it runs in the environment its config names, so a load
fails with the reason (a missing archive, another Python) instead of running in the wrong one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from shared.errors import ShoalError, unavailable
from shared.process import cache_dirs

PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
ACTIVE = "SHOAL_EXECUTION_ENV"  # set in a model's process: the environment it runs in
PACKED = (".tar.gz", ".tgz")


def requested(parameters: dict[str, str], model_dir: str) -> str | None:
    """The environment a model's config asks for, `$$TRITON_MODEL_DIRECTORY` replaced; None: Shoal's own."""
    value = parameters.get(PARAMETER, "").strip()
    return value.replace(MODEL_DIRECTORY, model_dir) if value else None


def prepare(path: str) -> Path:
    """The environment's root directory: `path` itself, or where its archive is unpacked (once)."""
    source = Path(path)
    if source.is_dir():
        return source.resolve()
    if not source.is_file():
        raise unavailable(f"{PARAMETER} '{path}' does not exist")
    if not source.name.endswith(PACKED):
        raise unavailable(f"{PARAMETER} '{path}' is neither a directory nor a .tar.gz archive")
    stat = source.stat()
    key = hashlib.sha256(f"{source.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    try:  # the code it runs: this user's only (docs/security.md), one another user made is not used
        target = cache_dirs.private_dir(cache_dirs.python_environments()) / key
    except OSError as exc:
        raise unavailable(f"{PARAMETER} '{path}': its cache {exc}") from None
    if not target.is_dir():
        _unpack(source, target)
    return target


def _unpack(archive: Path, target: Path) -> None:
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            # "tar" filter: nothing lands outside the directory; links inside an environment stay
            tar.extractall(scratch, filter="tar")
        os.rename(scratch, target)  # atomic: a concurrent unpack of the same archive loses the race harmlessly
    except OSError as exc:
        if not target.is_dir():
            raise unavailable(f"{PARAMETER} '{archive}' could not be unpacked: {exc}") from None
    except tarfile.TarError as exc:
        raise unavailable(f"{PARAMETER} '{archive}' could not be unpacked: {exc}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def site_packages(root: Path) -> Path:
    """The environment's site-packages for this Python, or why it has none."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = root / "lib" / version / "site-packages"
    if found.is_dir():
        return found
    others = sorted(p.parent.name for p in root.glob("lib/python*/site-packages"))
    has = f"it has site-packages for {', '.join(others)}" if others else "it has no lib/pythonX.Y/site-packages"
    raise unavailable(f"{PARAMETER} '{root}' is not an environment for {version}, the Python Shoal runs on: {has}")


def parameters_of(config: dict) -> dict[str, str]:
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items() if isinstance(v, dict)}


def process_environ(config: dict, model_dir: str) -> dict[str, str]:
    """What the model's process adds to its environment variables (nothing for Shoal's own environment).

    A failure leaves the variables unset: the process then fails the load with the reason (`check`)."""
    path = requested(parameters_of(config), model_dir)
    if path is None:
        return {}
    try:
        root = prepare(path)
        packages = site_packages(root)
    except ShoalError:
        return {}
    inherited = os.environ.get("PYTHONPATH")
    return {ACTIVE: str(root), "PYTHONPATH": os.pathsep.join([str(packages), *([inherited] if inherited else [])])}


def check(parameters: dict[str, str], model_dir: str) -> None:
    """In the process about to load a python model: refuse to run it outside the environment it asks for."""
    path = requested(parameters, model_dir)
    if path is None:
        return
    root = prepare(path)
    site_packages(root)
    if os.environ.get(ACTIVE) != str(root):
        raise unavailable(
            f"{PARAMETER} '{path}' needs the model in a process of its own (--python-isolation instance or model)"
        )

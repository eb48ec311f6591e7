"""Where Shoal keeps what it makes on this machine: `$XDG_CACHE_HOME/shoal` (`~/.cache/shoal`).

One place for every cache path, so that a test (or a user) moving `XDG_CACHE_HOME` moves all
of them, and a newcomer finds what lives there without reading each user.
"""

from __future__ import annotations

import os
from pathlib import Path


def root() -> Path:
    """Shoal's cache directory, read from the environment at each call (tests move it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shoal"


def example_models() -> Path:
    """The example repository `shoal serve` generates on first use without `--model-repository`."""
    return root() / "models"


def model_files() -> Path:
    """Model files a worker fetched from the object store, shared by the workers of this host
    (services/worker/model_files.py); `--model-cache-dir` moves it."""
    return root() / "model-files"


def repository_mirrors() -> Path:
    """The repository service's copies of cloud model repositories (services/repository/remote.py)."""
    return root() / "repositories"


def python_environments() -> Path:
    """Packed `EXECUTION_ENV_PATH` archives, unpacked once each (services/worker/python/processes/execution_environments.py)."""
    return root() / "envs"


def serve_records() -> Path:
    """One record per running `shoal serve`, named by its HTTP port (shoal/topology.py)."""
    return root() / "serve"

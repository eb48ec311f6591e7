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


def gguf_copies() -> Path:
    """GGUF files requantized at load (shoal/llm/requantize.py); `$SHOAL_GGUF_CACHE` moves it."""
    return Path(os.environ.get("SHOAL_GGUF_CACHE") or root() / "gguf")


def serve_records() -> Path:
    """One record per running `shoal serve`, named by its HTTP port (shoal/topology.py)."""
    return root() / "serve"


class NotPrivate(OSError):
    """A cache directory another user owns: what is in it could be anyone's (docs/security.md)."""


def private_dir(path: Path) -> Path:
    """`path` made (with its parents) or tightened to 0700, its own user's only: what Shoal caches
    (model files, code it runs) is read by nobody else, and nobody else puts anything there. The
    mode is set, not left to the umask (a umask of 022 gives every user read access). NotPrivate
    when another user owns it."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = path.stat()
    if info.st_uid != os.geteuid():
        raise NotPrivate(f"{path} belongs to another user (uid {info.st_uid}), not to this one (uid {os.geteuid()})")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path

"""Backend registry: backend name -> `Backend`, its module imported only when a model needs it.

A backend module exposes `BACKEND`, a `Backend` naming its default model file and the class
whose instances implement `Runner` (`services/worker/backends/runner.py`). A missing optional
dependency becomes a model-load error naming the extra to install; it never breaks the worker
or other models.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from services.worker.backends.runner import Runner
from shared.config.model_config import ModelSpec
from shared.config.paths import inside
from shared.errors import unavailable

_MODULES = {
    "onnxruntime": "services.worker.backends.onnxruntime_backend",
    "python": "services.worker.python.backend",
    "pytorch": "services.worker.backends.pytorch_backend",
    "tensorrt": "services.worker.backends.tensorrt_backend",
}
_EXTRAS = {
    "tensorrt": "shoal[gpu]",
    "pytorch": "shoal[torch]",
}


@dataclass(frozen=True)
class Placement:
    """Where and how one instance runs."""

    version: int
    kind: str  # KIND_CPU, KIND_GPU or KIND_MODEL
    device: int  # CUDA device of a KIND_GPU instance
    threads: int  # intra-op threads for backends that compute on the CPU
    name: str  # Triton's instance name


InstanceFactory = Callable[[ModelSpec, Path, Placement], Runner]


@dataclass(frozen=True)
class Backend:
    default_file: str  # the model file when the config names none (`default_model_filename`)
    factory: InstanceFactory
    shares_cores: bool = False  # its instances split the cores among them (intra-op threads)
    file_only: bool = False  # the model is a file, never a directory

    def create(self, spec: ModelSpec, model_dir: Path, placement: Placement) -> Runner:
        path = model_path(spec, model_dir, placement.version, self.default_file, self.file_only)
        return self.factory(spec, path, placement)

    def default_threads(self, instances: int) -> int:
        """Intra-op threads per instance when neither the config nor the worker's settings say:
        a backend that shares the cores gives each instance its share; the others one thread."""
        return default_threads(instances) if self.shares_cores else 1


def default_threads(instances: int) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, instances))


def load_backend(name: str) -> Backend:
    module = _MODULES.get(name)
    if module is None:
        hint = f" (install it with `pip install '{_EXTRAS[name]}'`)" if name in _EXTRAS else ""
        raise unavailable(f"backend '{name}' is not supported by this Shoal worker{hint}")
    try:
        backend: Backend = importlib.import_module(module).BACKEND
    except ImportError as exc:
        extra = _EXTRAS.get(name, "shoal")
        raise unavailable(f"backend '{name}' cannot be imported ({exc}); install `pip install '{extra}'`") from None
    return backend


def model_path(spec: ModelSpec, model_dir: Path, version: int, default: str, is_file: bool = False) -> Path:
    """The version's model file (`default_model_filename` or the backend's default name); a
    symlink may point within the repository, never out of it."""
    path = inside(model_dir.parent, f"{model_dir.name}/{version}/{spec.default_model_filename or default}")
    if not (path.is_file() if is_file else path.exists()):
        raise unavailable(f"unable to find '{path}' for model '{spec.name}'")
    return path

"""Backend registry: backend name -> `Backend`, its module imported only when a model needs it.

A backend module exposes `BACKEND`, a `Backend` naming its default model file and the class
whose instances implement `Runner` (`services/worker/backends/runner.py`). A missing optional
dependency becomes a model-load error naming the extra to install; it never breaks the worker
or other models. A name Shoal does not have built in is a python-based backend when
`<backend-directory>/<name>/model.py` exists (shared/config/backend_config.py), as in Triton.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from services.worker.backends.runner import Runner
from shared.config.backend_config import python_based_runtime, shared_library
from shared.config.model_config import ModelSpec
from shared.config.paths import inside
from shared.errors import unavailable

_MODULES = {
    "onnxruntime": "services.worker.backends.onnxruntime_backend",
    "python": "services.worker.python.hosting.python_backend",
    "pytorch": "services.worker.backends.pytorch_backend",
    "tensorrt": "services.worker.backends.tensorrt_backend",
    # Triton's own test backends, which its QA, tutorials and perf_analyzer examples use
    "identity": "services.worker.backends.identity_backend",
    "repeat": "services.worker.backends.repeat_backend",
    "square": "services.worker.backends.square_backend",
    "fil": "services.worker.backends.fil_backend",
    "openvino": "services.worker.backends.openvino_backend",
    "dali": "services.worker.backends.dali_backend",
}
_EXTRAS = {
    "fil": "shoal[fil]",
    "openvino": "shoal[openvino]",
    "dali": "shoal[dali]",
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
    index: int = 0  # the instance's place among the model's instances (0, 1, ...)
    settings: dict[str, str] = field(default_factory=dict)  # its backend's --backend-config settings


InstanceFactory = Callable[[ModelSpec, Path, Placement], Runner]


@dataclass(frozen=True)
class Backend:
    default_file: str  # the model file when the config names none (`default_model_filename`); "": no file
    factory: InstanceFactory
    shares_cores: bool = False  # its instances split the cores among them (intra-op threads)
    file_only: bool = False  # the model is a file, never a directory

    def create(self, spec: ModelSpec, model_dir: Path, placement: Placement) -> Runner:
        if not self.default_file:  # a backend that reads no model file of the version: it gets the directory
            return self.factory(spec, inside(model_dir.parent, f"{model_dir.name}/{placement.version}"), placement)
        path = model_path(spec, model_dir, placement.version, self.default_file, self.file_only)
        return self.factory(spec, path, placement)

    def default_threads(self, instances: int) -> int:
        """Intra-op threads per instance when neither the config nor the worker's settings say:
        a backend that shares the cores gives each instance its share; the others one thread."""
        return default_threads(instances) if self.shares_cores else 1


def default_threads(instances: int) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, instances))


def load_backend(name: str, directory: str = "") -> Backend:
    """The backend called `name`: built in, or python-based in `directory` (--backend-directory)."""
    module = _MODULES.get(name)
    if module is None:
        runtime = python_based_runtime(directory, name)
        if runtime is not None:  # the python backend's module, by name as every backend's (no import cycle)
            python_based: Callable[[Path], Backend] = importlib.import_module(_MODULES["python"]).python_based
            return python_based(runtime)
        library = shared_library(directory, name)
        if library is not None:
            raise unavailable(
                f"backend '{name}' is a C++ backend ({library}), which Shoal cannot load: Shoal runs its own "
                f"backends and python-based ones ({directory}/{name}/model.py)"
            )
        where = f"; no python-based backend {directory}/{name}/model.py either" if directory else ""
        raise unavailable(f"backend '{name}' is not supported by this Shoal worker{where}")
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
        raise unavailable(f"unable to find '{path}' for model '{spec.model_name}'")
    return path

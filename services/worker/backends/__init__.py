"""Backend registry: backend name -> module, imported only when a model needs it.

A backend module exposes `create_instance(spec, model_dir, version, kind, device, threads, name=...)`
returning an object with `run(inputs, output_names) -> dict[str, ndarray]` and
`close()`. A missing optional dependency becomes a model-load error naming the extra
to install; it never breaks the worker or other models.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from shared.errors import unavailable
from shared.model_config import ModelSpec
from shared.paths import inside

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


def load_backend(name: str) -> ModuleType:
    module = _MODULES.get(name)
    if module is None:
        hint = f" (install it with `pip install '{_EXTRAS[name]}'`)" if name in _EXTRAS else ""
        raise unavailable(f"backend '{name}' is not supported by this Shoal worker{hint}")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = _EXTRAS.get(name, "shoal")
        raise unavailable(f"backend '{name}' cannot be imported ({exc}); install `pip install '{extra}'`") from None


def model_path(spec: ModelSpec, model_dir: Path, version: int, default: str, is_file: bool = False) -> Path:
    """The version's model file (`default_model_filename` or the backend's default name); a
    symlink may point within the repository, never out of it."""
    path = inside(model_dir.parent, f"{model_dir.name}/{version}/{spec.default_model_filename or default}")
    if not (path.is_file() if is_file else path.exists()):
        raise unavailable(f"unable to find '{path}' for model '{spec.name}'")
    return path

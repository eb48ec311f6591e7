"""Backend registry: backend name -> module, imported only when a model needs it.

A backend module exposes `create_instance(spec, model_dir, version, kind, device, threads, name=...)`
returning an object with `run(inputs, output_names) -> dict[str, ndarray]` and
`close()`. A missing optional dependency becomes a model-load error naming the extra
to install; it never breaks the worker or other models.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from shared.errors import unavailable

_MODULES = {
    "onnxruntime": "services.worker.backends.onnxruntime_backend",
    "python": "services.worker.backends.python_backend",
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

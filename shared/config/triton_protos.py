"""Triton's protobuf modules from tritonclient (`model_config_pb2`, `service_pb2`,
`service_pb2_grpc`) without `tritonclient/grpc/__init__.py`.

That `__init__` imports tritonclient's gRPC client, its utilities and `packaging` before any of
these modules: 0.4 s of CPU in every gateway and repository start (docs/performance.md,
"Start-up"), for a client neither uses. Python runs a package's `__init__` before a submodule, so
the submodules are imported under a bare `tritonclient.grpc` package, made from the package's own
spec and never executed, which is taken out of `sys.modules` at once. They stay there under their
own names: a later `import tritonclient.grpc` (a client in the same process) runs the real
`__init__`, which binds these same module objects (each message class exists once).

Where tritonclient's layout is not what this expects (no such package, or it was imported
already), the plain import is used: the same modules, only slower to import.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

_PACKAGE = "tritonclient.grpc"
_NAMES = ("model_config_pb2", "service_pb2", "service_pb2_grpc")


def _without_package_init(name: str) -> ModuleType:
    if _PACKAGE in sys.modules:  # imported for real already, or being imported by another caller
        return importlib.import_module(f"{_PACKAGE}.{name}")
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or spec.submodule_search_locations is None:
        return importlib.import_module(f"{_PACKAGE}.{name}")  # let the plain import say what is missing
    bare = importlib.util.module_from_spec(spec)  # `__path__` and `__spec__`, its code not run
    sys.modules[_PACKAGE] = bare
    try:
        return importlib.import_module(f"{_PACKAGE}.{name}")
    finally:
        if sys.modules.get(_PACKAGE) is bare:
            del sys.modules[_PACKAGE]


def load(name: str) -> ModuleType:
    """`model_config_pb2`, `service_pb2` or `service_pb2_grpc` (those import the ones before them)."""
    if name not in _NAMES:
        raise ValueError(f"not one of tritonclient's protobuf modules: {name}")
    return _without_package_init(name)

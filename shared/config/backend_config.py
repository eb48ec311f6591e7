"""`--backend-directory` and `--backend-config`, as tritonserver reads them.

`--backend-config=<backend>,<setting>=<value>` gives one backend a setting and
`--backend-config=<setting>=<value>` gives it to every backend (Triton's backend-agnostic
settings, `default-max-batch-size` among them). A backend a config names that Shoal does not
have built in is looked for where Triton looks: `<backend-directory>/<name>/`. A `model.py`
there makes it a python-based backend (Triton's vLLM backend is one); a `libtriton_<name>.so`
is a C++ backend, which Shoal cannot load and says so.
"""

from __future__ import annotations

from pathlib import Path

GLOBAL = ""  # the settings given to every backend
DEFAULT_DIRECTORY = "/opt/tritonserver/backends"  # tritonserver's default --backend-directory
DEFAULT_MAX_BATCH_SIZE = 4  # tritonserver's default for `default-max-batch-size`

# the backends Shoal runs itself (services/worker/backends/__init__.py); any other name is looked
# for in the backend directory
BUILT_IN = frozenset(
    {"onnxruntime", "python", "pytorch", "tensorrt", "identity", "repeat", "square", "fil", "openvino", "dali"}
)

BackendConfig = dict[str, dict[str, str]]  # backend ("" for all) -> setting -> value

# the settings Shoal's backends read (every backend: default-max-batch-size, for auto-complete)
PYTHON_SETTINGS = frozenset(
    {
        "shm-default-byte-size",
        "shm-growth-byte-size",
        "stub-timeout-seconds",
        "thread-pool-size",
        "shm-region-prefix-name",
        "shm_message_queue_size",
    }
)
_READ = {"python": PYTHON_SETTINGS, "dali": frozenset({"release_after_unload"})}


def unread(settings: dict[str, str], backend: str, python_based: bool) -> list[str]:
    """The settings given to `backend` that no part of Shoal reads (said once in the log)."""
    read = _READ.get("python" if python_based else backend, frozenset()) | {"default-max-batch-size"}
    return sorted(key for key in settings if key not in read)


def parse_option(entry: str) -> tuple[str, str, str]:
    """One `--backend-config` value: (backend, setting, value), with tritonserver's errors."""
    comma = entry.find(",")
    if comma == 0:
        raise ValueError(
            "No backend specified. --backend-config option format is <backend name>,<setting>=<value> "
            f"or <setting>=<value>. Got {entry}"
        )
    backend = entry[:comma] if comma > 0 else GLOBAL
    rest = entry[comma + 1 :]
    setting, equals, value = rest.partition("=")
    if not equals or not setting or not value:
        raise ValueError(f"--backend-config option format is '<backend name>,<setting>=<value>'. Got {entry}")
    return backend, setting, value


def parse(entries: list[str]) -> BackendConfig:
    config: BackendConfig = {}
    for entry in entries:
        backend, setting, value = parse_option(entry)
        config.setdefault(backend, {})[setting] = value
    return config


def settings_for(config: BackendConfig, backend: str) -> dict[str, str]:
    """What one backend is given: the global settings, then its own (which win)."""
    return {**config.get(GLOBAL, {}), **config.get(backend, {})}


def default_max_batch_size(config: BackendConfig, backend: str) -> int:
    """The max_batch_size auto-complete gives a model that can batch (Triton's default 4)."""
    value = settings_for(config, backend).get("default-max-batch-size", "")
    try:
        return max(0, int(value)) if value else DEFAULT_MAX_BATCH_SIZE
    except ValueError:
        return DEFAULT_MAX_BATCH_SIZE


def python_based_runtime(directory: str, backend: str) -> Path | None:
    """`<directory>/<backend>/model.py` when `backend` is a python-based backend there."""
    if not directory or not backend or backend in BUILT_IN or "/" in backend or backend.startswith("."):
        return None
    runtime = Path(directory) / backend / "model.py"
    return runtime if runtime.is_file() else None


def shared_library(directory: str, backend: str) -> Path | None:
    """`<directory>/<backend>/libtriton_<backend>.so` when it is there (a C++ backend)."""
    if not directory or not backend or "/" in backend or backend.startswith("."):
        return None
    library = Path(directory) / backend / f"libtriton_{backend}.so"
    return library if library.is_file() else None

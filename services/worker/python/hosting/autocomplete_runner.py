"""Run a python model's `auto_complete_config` in a process of its own.

The repository service calls this as `python -m services.worker.python.hosting.autocomplete_runner
<model.py>` with the config (Triton's JSON) on stdin and reads the completed config from
stdout. A process of its own because the model's module runs arbitrary code at import
(heavy imports, GPU setup, crashes) that must not run inside the repository service.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from services.worker.python.hosting.python_backend import _import
from services.worker.python.triton_api import pb_utils


def complete(model_file: Path, config: dict) -> dict:
    module = _import(model_file)
    model_class = getattr(module, "TritonPythonModel", None)
    if model_class is None or not hasattr(model_class, "auto_complete_config"):
        return config
    result = model_class.auto_complete_config(pb_utils.ModelConfig(config))
    return result.as_dict() if isinstance(result, pb_utils.ModelConfig) else config


def main() -> None:
    config = json.load(sys.stdin)
    result = sys.stdout
    sys.stdout = sys.stderr  # what the model prints must not mix with the result
    try:
        completed = complete(Path(sys.argv[1]), config)
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
    json.dump(completed, result)


if __name__ == "__main__":
    main()

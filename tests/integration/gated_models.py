"""Models that load only when the test says so: a slow repository and a slow worker on purpose,
not by luck of timing (tests/integration/test_readiness.py, benchmarks/readiness.py).

- `repository_gate`: its `auto_complete_config`, which the repository runs while it reads the
  model, waits for a file: the repository has published the models before it and not this one
  nor those after it.
- `worker_gate`: its `initialize`, which the worker runs to load it, waits for a file: its record
  stays LOADING.

Each waits with a deadline (a test that fails never leaves them hanging) and says that it waits
with a file beside the gate (`<gate>.waiting`).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from onnx import TensorProto

from services.repository import examples
from tests.cluster import identity_config

GATE_WAIT_S = 50.0  # under the repository's 60 s for an auto_complete_config

MODEL_PY = """
import os
import time

import triton_python_backend_utils as pb_utils


def wait_for(path):
    if path:
        open(path + ".waiting", "w").close()  # the test sees where it waits
    deadline = time.monotonic() + {wait}
    while path and not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        wait_for({repository_gate!r})
        return config

    def initialize(self, args):
        wait_for({worker_gate!r})

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
"""


def write_python(root: Path, name: str, repository_gate: Path | None = None, worker_gate: Path | None = None) -> None:
    """A python identity model (FP32 [4]) whose repository read and load wait for these files (None: no wait)."""
    (root / name / "1").mkdir(parents=True)
    source = MODEL_PY.format(
        wait=GATE_WAIT_S,
        repository_gate=str(repository_gate or ""),
        worker_gate=str(worker_gate or ""),
    )
    (root / name / "1" / "model.py").write_text(textwrap.dedent(source))
    (root / name / "config.pbtxt").write_text(CONFIG.format(name=name))


def write_onnx(root: Path, name: str) -> None:
    """An ONNX identity model (FP32 [-1], no batching): loads at once."""
    examples.write_model(
        root, name, examples.identity_graph(TensorProto.FLOAT, 1, name), identity_config(name, "FP32", 0)
    )

"""The resource soak's model repository (benchmarks/soak_resources.py): the examples
(services/repository/examples.py: `simple` and `mlp` on onnxruntime, `identity_fp32` with dynamic
batching) plus a python model with dynamic batching, an ensemble of it and an ONNX model, a
sequence model and a decoupled model."""

from __future__ import annotations

import textwrap
from pathlib import Path

from services.repository import examples
from tests.integration.ensemble_models import ensemble_config, write_ensemble, write_python

# what a request to each model needs loaded: an ensemble fails while a step is reloaded
DEPENDS = {"ensemble": ("ensemble", "py_double", "identity_fp32")}

# Triton's classic stateful python model: a running sum per correlation id
SEQUENCE_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            cid, flags = request.correlation_id(), request.flags()
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.sums[cid] = 0
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
            self.sums[cid] = self.sums.get(cid, 0) + value
            total = self.sums[cid]
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                del self.sums[cid]
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", np.array([[total]], np.int32))]))
        return responses

    def sequence_ended(self, correlation_id, reason):
        self.sums.pop(correlation_id, None)
"""

SEQUENCE_CONFIG = """
name: "accumulate"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching { max_sequence_idle_microseconds: 10000000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

# decoupled: N responses (0, 1, ... N-1), then the final flag, sent from execute itself
STREAM_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
            sender = request.get_response_sender()
            for i in range(count):
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

STREAM_CONFIG = """
name: "streamer"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _write_python_model(root: Path, name: str, source: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(textwrap.dedent(source))
    (root / name / "config.pbtxt").write_text(textwrap.dedent(config))


def write_repository(root: Path) -> Path:
    """Every model the soak drives, written into `root`; returns `root`."""
    examples.write_examples(root)
    write_python(root, "py_double", "double")  # dynamic batching, up to 8
    fp32 = "TYPE_FP32"
    steps = [
        ("py_double", {"X": "RAW"}, {"Y": "doubled"}),
        ("identity_fp32", {"INPUT0": "doubled"}, {"OUTPUT0": "OUT"}),
    ]
    write_ensemble(root, "ensemble", ensemble_config("ensemble", [("RAW", fp32, "-1")], [("OUT", fp32, "-1")], steps))
    _write_python_model(root, "accumulate", SEQUENCE_PY, SEQUENCE_CONFIG)
    _write_python_model(root, "streamer", STREAM_PY, STREAM_CONFIG)
    return root

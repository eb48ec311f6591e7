"""The LLM-streaming pattern as a model repository: preprocess -> decoupled generator ->
postprocess, all python models, for the decoupled-ensemble tests and benchmark.

`llm` streams one response per prompt value; `llm_one` is the same with
`max_inflight_requests: 1`; `llm_outer` wraps `llm` (a nested ensemble). Request parameters (inherited by every step): `blob` (floats in
the per-iteration intermediate, 32768 = 128 KiB), `delay` (seconds between the generator's
responses), `fail_at` (the generator fails at that response).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

PRE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1)]) for r in requests]
"""

# answers from a thread, one response per prompt value: TOKEN = 10 * value, IDX = i and a
# BLOB of `blob` floats (large ones go through shared memory)
GEN = """
import json
import os
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.dir = pb_utils.get_model_dir()

    def execute(self, requests):
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()
            params = json.loads(request.parameters())
            threading.Thread(target=self.stream, args=(request, prompt, params), daemon=True).start()
        return None

    def stream(self, request, prompt, params):
        sender = request.get_response_sender()
        for i, value in enumerate(prompt):
            if sender.is_cancelled():
                open(os.path.join(self.dir, "cancelled-" + request.request_id()), "w").close()
                return
            if params.get("fail_at") == i:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"failed at {i}")),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("TOKEN", np.array([value * 10], np.int32)),
                pb_utils.Tensor("IDX", np.array([i], np.uint32)),
                pb_utils.Tensor("BLOB", np.full(params.get("blob", 1), i, np.float32))]))
            time.sleep(params.get("delay", 0))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# reads the iteration's token and blob together with the preprocess output (upstream)
POST = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            token = pb_utils.get_input_tensor_by_name(r, "TOKEN").as_numpy()
            prompt = pb_utils.get_input_tensor_by_name(r, "PROMPT").as_numpy()
            blob = pb_utils.get_input_tensor_by_name(r, "BLOB").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", (token + 1000 * len(prompt)).astype(np.int32)),
                pb_utils.Tensor("SUM", np.array([blob.sum()], np.float32))]))
        return responses
"""


def _python(name: str, inputs: str, outputs: str, extra: str = "") -> str:
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\ninput [ {inputs} ]\noutput [ {outputs} ]\n'
        f"instance_group [ {{ count: 1 kind: KIND_CPU }} ]\n{extra}"
    )


def _ensemble(name: str, extra: str = "") -> str:
    return f'''
name: "{name}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }},
         {{ name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }} ]
ensemble_scheduling {{
  {extra}
  step [ {{ model_name: "pre" model_version: -1 input_map {{ key: "X" value: "IN" }} output_map {{ key: "Y" value: "prompt" }} }} ]
  step [ {{ model_name: "gen" model_version: -1 input_map {{ key: "PROMPT" value: "prompt" }}
           output_map {{ key: "TOKEN" value: "token" }} output_map {{ key: "IDX" value: "IDX" }}
           output_map {{ key: "BLOB" value: "blob" }} }} ]
  step [ {{ model_name: "post" model_version: -1
           input_map {{ key: "TOKEN" value: "token" }} input_map {{ key: "PROMPT" value: "prompt" }}
           input_map {{ key: "BLOB" value: "blob" }}
           output_map {{ key: "OUT" value: "OUT" }} output_map {{ key: "SUM" value: "SUM" }} }} ]
}}
'''


def _outer(name: str, inner: str) -> str:
    """An ensemble whose only step is the streaming ensemble `inner`: decoupled through it."""
    maps = " ".join(
        f'input_map {{ key: "{t}" value: "{t}" }}' if t == "IN" else f'output_map {{ key: "{t}" value: "{t}" }}'
        for t in ("IN", "OUT", "IDX", "SUM")
    )
    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }},
         {{ name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "{inner}" model_version: -1 {maps} }} ] }}
"""


def _model(root: Path, name: str, config: str, source: str = "") -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    if source:
        (root / name / "1" / "model.py").write_text(textwrap.dedent(source))


def write_models(root: Path) -> None:
    i32 = "data_type: TYPE_INT32 dims: [ -1 ]"
    _model(root, "pre", _python("pre", f'{{ name: "X" {i32} }}', f'{{ name: "Y" {i32} }}'), PRE)
    _model(
        root,
        "gen",
        _python(
            "gen",
            f'{{ name: "PROMPT" {i32} }}',
            '{ name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }, '
            '{ name: "BLOB" data_type: TYPE_FP32 dims: [ -1 ] }',
            "model_transaction_policy { decoupled: true }",
        ),
        GEN,
    )
    _model(
        root,
        "post",
        _python(
            "post",
            f'{{ name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "PROMPT" {i32} }}, '
            '{ name: "BLOB" data_type: TYPE_FP32 dims: [ -1 ] }',
            '{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }',
        ),
        POST,
    )
    _model(root, "llm", _ensemble("llm"))
    _model(root, "llm_one", _ensemble("llm_one", "max_inflight_requests: 1"))
    _model(root, "llm_outer", _outer("llm_outer", "llm"))

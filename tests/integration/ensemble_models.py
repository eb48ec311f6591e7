"""A model repository of ensembles and their composing models, for the ensemble tests and benchmark.

Composing models are small python-backend models (they can sleep, fail and handle BYTES)
plus one ONNX identity; a request parameter `delay_ms` (inherited by every step) makes
the python ones sleep, which is how the tests see steps run in parallel.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from onnx import TensorProto

from services.repository import examples

PY_MODEL = """
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils

OP = "{op}"


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            delay = json.loads(request.parameters() or "{{}}").get("delay_ms", 0)
            if delay:
                time.sleep(delay / 1000)
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if OP == "fail" and x.astype(np.float64).sum() < 0:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative input", pb_utils.TritonError.INVALID_ARG)))
                continue
            if OP == "double":
                y = (x * 2).astype(np.float32)
            elif OP == "sum":
                y = x.sum(axis=1, keepdims=True).astype(np.float32)
            elif OP == "triple":
                y = (x * 3).astype(np.float32)
            elif OP == "upper":
                y = np.array([s.upper() for s in x.reshape(-1)], dtype=object).reshape(x.shape)
            elif OP == "reverse":
                y = np.array([s[::-1] for s in x.reshape(-1)], dtype=object).reshape(x.shape)
            else:
                y = x
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", y)]))
        return responses
"""

PY_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "X" data_type: {dtype} dims: [ -1 ] }} ]
output [ {{ name: "Y" data_type: {dtype} dims: [ {out_dims} ] }} ]
{batching}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def ensemble_config(
    name: str,
    inputs: list[tuple[str, str, str]],
    outputs: list[tuple[str, str, str]],
    steps: list[tuple[str, dict[str, str], dict[str, str]]],
    max_batch_size: int = 8,
) -> str:
    """`inputs`/`outputs`: (name, TYPE_*, dims); `steps`: (model, input_map, output_map)."""

    def io(items):
        return ", ".join(f'{{ name: "{n}" data_type: {t} dims: [ {d} ] }}' for n, t, d in items)

    def maps(kind, mapping):
        return " ".join(f'{kind} {{ key: "{k}" value: "{v}" }}' for k, v in mapping.items())

    step_text = "\n".join(
        f'  step [ {{ model_name: "{m}" model_version: -1 {maps("input_map", i)} {maps("output_map", o)} }} ]'
        for m, i, o in steps
    )
    return (
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
        f"input [ {io(inputs)} ]\noutput [ {io(outputs)} ]\nensemble_scheduling {{\n{step_text}\n}}\n"
    )


def write_python(
    root: Path,
    name: str,
    op: str,
    dtype: str = "TYPE_FP32",
    out_dims: str = "-1",
    batching: str = "dynamic_batching { max_queue_delay_microseconds: 500 }",
    max_batch_size: int = 8,
) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(textwrap.dedent(PY_MODEL.format(op=op)))
    (root / name / "config.pbtxt").write_text(
        PY_CONFIG.format(name=name, dtype=dtype, out_dims=out_dims, batching=batching, max_batch_size=max_batch_size)
    )


def write_ensemble(root: Path, name: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)  # Triton wants a version directory, even empty
    (root / name / "config.pbtxt").write_text(config)


F = "TYPE_FP32"


def build(root: Path, bad: bool = True) -> Path:
    write_python(root, "preprocess", "double")
    write_python(root, "classify", "sum", out_dims="1")
    write_python(root, "segment", "triple")
    write_python(root, "checker", "fail")
    write_python(root, "upper", "upper", dtype="TYPE_STRING")
    write_python(root, "reverse", "reverse", dtype="TYPE_STRING")
    write_python(root, "flat", "triple", batching="", max_batch_size=0)  # no batch dimension
    examples.write_model(
        root,
        "identity",
        examples.identity_graph(TensorProto.FLOAT, 2, "identity"),
        'name: "identity"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        "dynamic_batching { }\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n",
    )
    # preprocess -> (classify || segment)
    write_ensemble(
        root,
        "pipeline",
        ensemble_config(
            "pipeline",
            [("RAW", F, "-1")],
            [("SCORES", F, "1"), ("MASK", F, "-1")],
            [
                ("preprocess", {"X": "RAW"}, {"Y": "pre"}),
                ("classify", {"X": "pre"}, {"Y": "SCORES"}),
                ("segment", {"X": "pre"}, {"Y": "MASK"}),
            ],
        ),
    )
    # an ensemble inside an ensemble, then an ONNX model
    write_ensemble(
        root,
        "nested",
        ensemble_config(
            "nested",
            [("IN", F, "-1")],
            [("OUT", F, "-1"), ("SCORE", F, "1")],
            [
                ("pipeline", {"RAW": "IN"}, {"MASK": "mask", "SCORES": "SCORE"}),
                ("identity", {"INPUT0": "mask"}, {"OUTPUT0": "OUT"}),
            ],
        ),
    )
    write_ensemble(
        root,
        "failing",
        ensemble_config(
            "failing",
            [("RAW", F, "-1")],
            [("OUT", F, "-1")],
            [("preprocess", {"X": "RAW"}, {"Y": "pre"}), ("checker", {"X": "pre"}, {"Y": "OUT"})],
        ),
    )
    write_ensemble(
        root,
        "text",
        ensemble_config(
            "text",
            [("TEXT", "TYPE_STRING", "-1")],
            [("OUT", "TYPE_STRING", "-1")],
            [("upper", {"X": "TEXT"}, {"Y": "up"}), ("reverse", {"X": "up"}, {"Y": "OUT"})],
        ),
    )
    # batching -> non-batching -> out of a batching ensemble: the batch dimension of 1 comes and goes
    write_ensemble(
        root,
        "mixed",
        ensemble_config(
            "mixed",
            [("RAW", F, "-1")],
            [("OUT", F, "-1")],
            [("preprocess", {"X": "RAW"}, {"Y": "pre"}), ("flat", {"X": "pre"}, {"Y": "OUT"})],
        ),
    )
    if bad:
        write_ensemble(
            root,
            "bad_unknown",
            ensemble_config(
                "bad_unknown", [("RAW", F, "-1")], [("OUT", F, "-1")], [("no_such_model", {"X": "RAW"}, {"Y": "OUT"})]
            ),
        )
        write_ensemble(
            root,
            "bad_unwritten",
            ensemble_config(
                "bad_unwritten",
                [("RAW", F, "-1")],
                [("OUT", F, "-1"), ("OTHER", F, "-1")],
                [("preprocess", {"X": "RAW"}, {"Y": "OUT"}), ("segment", {"X": "missing"}, {"Y": "OTHER"})],
            ),
        )
        write_ensemble(
            root,
            "bad_cycle",
            ensemble_config(
                "bad_cycle",
                [("RAW", F, "-1")],
                [("OUT", F, "-1")],
                [
                    ("preprocess", {"X": "b"}, {"Y": "a"}),
                    ("segment", {"X": "a"}, {"Y": "b"}),
                    ("classify", {"X": "RAW"}, {"Y": "OUT"}),
                ],
            ),
        )
        write_ensemble(
            root,
            "bad_dtype",
            ensemble_config(
                "bad_dtype",
                [("RAW", F, "-1")],
                [("OUT", "TYPE_STRING", "-1")],
                [("preprocess", {"X": "RAW"}, {"Y": "pre"}), ("upper", {"X": "pre"}, {"Y": "OUT"})],
            ),
        )
    return root

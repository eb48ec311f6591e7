"""The OpenVINO backend on the example MLP, converted to OpenVINO IR here: answers within 1e-5
of onnxruntime for IR and ONNX, batches of any size, the static batch with padding, the
backend's parameter checks, and auto-complete of inputs and outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from services.repository import examples
from services.repository.autocomplete import autocomplete_openvino
from services.worker.backends import Placement, load_backend
from services.worker.backends.openvino_backend import device_properties, precision
from services.worker.backends.runner import Batch, Work
from shared.config import model_config
from shared.errors import ShoalError

ov = pytest.importorskip("openvino", reason="the OpenVINO tests need the openvino extra: pip install 'shoal[openvino]'")

MLP = """
name: "{name}"
backend: "openvino"
max_batch_size: 8
{extra}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
"""


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example repository's MLP as ONNX and as OpenVINO IR (FP32 weights)."""
    root = tmp_path_factory.mktemp("openvino")
    examples.write_examples(root)
    onnx_file = root / "mlp" / "1" / "model.onnx"
    ov.save_model(ov.convert_model(str(onnx_file)), str(root / "model.xml"), compress_to_fp16=False)
    return root


def create(mlp: Path, name: str, extra: str = "", files: tuple[str, ...] = ("model.xml", "model.bin")):
    version = mlp / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    for file in files:
        source = mlp / "mlp" / "1" / file if file.endswith(".onnx") else mlp / file
        (version / file).write_bytes(source.read_bytes())
    parsed = model_config.parse_text(MLP.format(name=name, extra=extra))
    model_config.normalize(parsed)
    spec = model_config.spec_from_json(model_config.to_json(parsed))
    return load_backend("openvino").create(spec, mlp / name, Placement(1, "KIND_CPU", 0, 1, name))


def reference(mlp: Path, rows: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(mlp / "mlp" / "1" / "model.onnx"), options)
    return session.run(None, {"INPUT0": rows})[0]


def infer(instance, rows: np.ndarray) -> np.ndarray:
    parts = np.split(rows, [len(rows) // 2]) if len(rows) > 1 else [rows]
    results = instance.execute(Batch([Work({"INPUT0": p}, ["OUTPUT0"], len(p)) for p in parts]))
    return np.concatenate([r["OUTPUT0"] for r in results])


ROWS = np.random.default_rng(3).random((7, 256), dtype=np.float32)


def test_ir_and_onnx_answer_within_1e_5_of_onnxruntime_at_every_batch_size(mlp):
    expected = reference(mlp, ROWS)
    ir = create(mlp, "mlp_ir")
    onnx = create(mlp, "mlp_onnx", 'default_model_filename: "model.onnx"', ("model.onnx",))
    for size in (1, 3, 7):
        np.testing.assert_allclose(infer(ir, ROWS[:size]), expected[:size], atol=1e-5, rtol=0)
        np.testing.assert_allclose(infer(onnx, ROWS[:size]), expected[:size], atol=1e-5, rtol=0)


def test_a_static_batch_needs_padding_as_in_triton(mlp):
    skip = 'parameters [ { key: "SKIP_OV_DYNAMIC_BATCHSIZE" value: { string_value: "YES" } } ]'
    static = create(mlp, "mlp_static", skip)
    with pytest.raises(ShoalError, match="expected requests with batch size '8', got '3'"):
        infer(static, ROWS[:3])
    padded = create(
        mlp,
        "mlp_padded",
        'parameters [ { key: "SKIP_OV_DYNAMIC_BATCHSIZE" value: { string_value: "YES" } }, '
        '{ key: "ENABLE_BATCH_PADDING" value: { string_value: "YES" } } ]',
    )
    np.testing.assert_allclose(infer(padded, ROWS[:3]), reference(mlp, ROWS[:3]), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "parameters, message",
    [
        ('{ key: "NUM_STREAMS" value: { string_value: "many" } }', "to be either AUTO/NUMA/<int_value>, got many"),
        (
            '{ key: "PERFORMANCE_HINT" value: { string_value: "fast" } }',
            "LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT, got fast",
        ),
        ('{ key: "INFERENCE_NUM_THREADS" value: { string_value: "-2" } }', "to be a non-negative number, got -2"),
    ],
)
def test_parameter_checks(mlp, parameters, message):
    with pytest.raises(ShoalError, match=message):
        create(mlp, "mlp_bad", f"parameters [ {parameters} ]")


def test_parameters_that_are_accepted(mlp):
    instance = create(
        mlp,
        "mlp_tuned",
        'parameters [ { key: "NUM_STREAMS" value: { string_value: "1" } }, '
        '{ key: "PERFORMANCE_HINT" value: { string_value: "LATENCY" } }, '
        '{ key: "INFERENCE_NUM_THREADS" value: { string_value: "1" } }, '
        '{ key: "RESHAPE_IO_LAYERS" value: { string_value: "YES" } } ]',
    )
    np.testing.assert_allclose(infer(instance, ROWS), reference(mlp, ROWS), atol=1e-5, rtol=0)


def test_wrong_io_names_fail_with_the_backends_words(mlp):
    (mlp / "mlp_names" / "1").mkdir(parents=True)
    with pytest.raises(ShoalError, match="unexpected inference input 'INPUT0'|allowed inputs are"):
        version = mlp / "mlp_names" / "1"
        for file in ("model.xml", "model.bin"):
            (version / file).write_bytes((mlp / file).read_bytes())
        text = MLP.format(name="mlp_names", extra="").replace('name: "INPUT0"', 'name: "IN"')
        parsed = model_config.parse_text(text)
        model_config.normalize(parsed)
        spec = model_config.spec_from_json(model_config.to_json(parsed))
        load_backend("openvino").create(spec, mlp / "mlp_names", Placement(1, "KIND_CPU", 0, 1, "mlp_names"))


def test_auto_complete_fills_inputs_and_outputs(mlp):
    config = model_config.parse_text('name: "auto"\nbackend: "openvino"\n')
    autocomplete_openvino(config, mlp / "model.xml")
    completed = model_config.to_json(config)
    assert [(i["name"], i["data_type"], i["dims"]) for i in completed["input"]] == [("INPUT0", "TYPE_FP32", [-1, 256])]
    assert [(o["name"], o["dims"]) for o in completed["output"]] == [("OUTPUT0", [-1, 16])]
    assert completed["max_batch_size"] == 0  # no batch in the model's layout: Triton's rule


def bf16_cpu() -> bool:
    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def test_the_backend_asks_for_f32_unless_hint_bf16():
    parsed = model_config.parse_text(MLP.format(name="hints", extra=""))
    model_config.normalize(parsed)
    spec = model_config.spec_from_json(model_config.to_json(parsed))
    assert device_properties(spec, 2) == {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": "2"}
    parsed.parameters["HINT_BF16"].string_value = "YES"
    spec = model_config.spec_from_json(model_config.to_json(parsed))
    assert device_properties(spec, 0) == {"INFERENCE_PRECISION_HINT": "bf16"}


def test_the_properties_reach_the_compiled_model(mlp):
    """What the compiled model runs with, as OpenVINO reports it: f32 whatever the CPU's own default
    (bf16 on CPUs with AMX or AVX512-BF16, where outputs would move by ~1e-3), and the instance's
    thread count (the same properties, so the same call)."""
    instance = create(mlp, "mlp_f32")
    assert precision(instance.compiled) == "f32"
    assert int(instance.compiled.get_property("INFERENCE_NUM_THREADS")) == 1  # the placement's one thread


@pytest.mark.skipif("not bf16_cpu()", reason="this CPU has no BF16 (OpenVINO keeps f32 whatever is asked)")
def test_hint_bf16_reaches_the_compiled_model(mlp):
    default = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
    assert default == "bf16"  # OpenVINO's own default on such a CPU: what the f32 hint overrides
    instance = create(mlp, "mlp_bf16", 'parameters [ { key: "HINT_BF16" value: { string_value: "YES" } } ]')
    assert precision(instance.compiled) == "bf16"
    f32 = create(mlp, "mlp_f32_on_bf16")
    assert precision(f32.compiled) == "f32"
    np.testing.assert_allclose(infer(f32, ROWS), reference(mlp, ROWS), atol=1e-5, rtol=0)

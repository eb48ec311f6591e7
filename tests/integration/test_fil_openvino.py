"""The FIL and OpenVINO backends through the real system: tree models trained here and the
example MLP converted to OpenVINO IR here, answered through tritonclient (HTTP and gRPC) with
dynamic batching, and measured by perf_analyzer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from services.repository import examples
from tests.cluster import Running, running_cluster
from tests.integration.test_perf_analyzer import run as perf_run

xgb = pytest.importorskip("xgboost", reason="the FIL tests need the fil extra: pip install 'shoal[fil]'")
lgb = pytest.importorskip("lightgbm", reason="the FIL tests need the fil extra: pip install 'shoal[fil]'")
pytest.importorskip("treelite", reason="the FIL tests need the fil extra: pip install 'shoal[fil]'")
ov = pytest.importorskip("openvino", reason="the OpenVINO tests need the openvino extra: pip install 'shoal[openvino]'")

ROOT = Path(__file__).resolve().parents[2]
FEATURES = 16
RNG = np.random.default_rng(11)
X = RNG.random((400, FEATURES), dtype=np.float32)


def fil_config(name: str, model_type: str, outputs: int, extra: str, more_outputs: str = "") -> str:
    return f"""
name: "{name}"
backend: "fil"
max_batch_size: 64
input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }} ]
output [ {{ name: "output__0" data_type: TYPE_FP32 dims: [ {outputs} ] }} {more_outputs} ]
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
parameters [ {{ key: "model_type" value: {{ string_value: "{model_type}" }} }},
             {{ key: "is_classifier" value: {{ string_value: "true" }} }} {extra} ]
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("fil_models")
    labels = (X[:, 0] + X[:, 1] > 1).astype(int)
    booster = xgb.train({"objective": "binary:logistic", "max_depth": 5}, xgb.DMatrix(X, label=labels), 30)
    (root / "fil_xgb" / "1").mkdir(parents=True)
    booster.save_model(str(root / "fil_xgb" / "1" / "xgboost.ubj"))
    proba = ', { key: "predict_proba" value: { string_value: "true" } }'
    (root / "fil_xgb" / "config.pbtxt").write_text(fil_config("fil_xgb", "xgboost_ubj", 2, proba))
    (root / "fil_shap" / "1").mkdir(parents=True)  # FIL's explainability output (docs/explainability.md)
    booster.save_model(str(root / "fil_shap" / "1" / "xgboost.ubj"))
    shap = f', {{ name: "treeshap_output" data_type: TYPE_FP32 dims: [ {FEATURES + 1} ] }}'
    (root / "fil_shap" / "config.pbtxt").write_text(fil_config("fil_shap", "xgboost_ubj", 2, proba, shap))
    three = np.minimum((X[:, 2] * 3).astype(int), 2)
    forest = lgb.train({"objective": "multiclass", "num_class": 3, "verbose": -1}, lgb.Dataset(X, label=three), 10)
    (root / "fil_lgbm" / "1").mkdir(parents=True)
    forest.save_model(str(root / "fil_lgbm" / "1" / "model.txt"))
    (root / "fil_lgbm" / "config.pbtxt").write_text(fil_config("fil_lgbm", "lightgbm", 1, ""))
    write_openvino_models(root)
    own = booster.inplace_predict(X)
    expected = {
        "fil_xgb": np.stack([1 - own, own], axis=1),
        "fil_lgbm": np.argmax(forest.predict(X), axis=1).astype(np.float32),  # dims [1]: [n], as FIL answers
        "fil_shap": booster.predict(xgb.DMatrix(X), pred_contribs=True),  # what Triton's FIL QA compares with
    }
    return root, expected


OV_MLP = """
name: "ov_mlp"
backend: "openvino"
max_batch_size: 16
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters [ { key: "INFERENCE_NUM_THREADS" value: { string_value: "1" } } ]
"""


def write_openvino_models(root: Path) -> None:
    """The example MLP converted to OpenVINO IR, and the same IR with no inputs or outputs in its
    config (auto-completed from the model)."""
    examples.write_examples(root / "examples")
    onnx_file = root / "examples" / "mlp" / "1" / "model.onnx"
    # ov_plain: no backend line, model.xml says it (core's autofill; issue 48)
    for name, config in (("ov_mlp", OV_MLP), ("ov_auto", 'backend: "openvino"\n'), ("ov_plain", "")):
        (root / name / "1").mkdir(parents=True)
        ov.save_model(ov.convert_model(str(onnx_file)), str(root / name / "1" / "model.xml"), compress_to_fp16=False)
        (root / name / "config.pbtxt").write_text(config)
    (root / "reference_mlp.onnx").write_bytes(onnx_file.read_bytes())
    for path in sorted((root / "examples").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    (root / "examples").rmdir()


@pytest.fixture(scope="module")
def served(models) -> Running:
    with running_cluster(models[0]) as running:
        yield running


@pytest.mark.parametrize("model", ["fil_xgb", "fil_lgbm"])
def test_fil_answers_equal_the_library_over_http_and_grpc(served, models, model):
    expected = models[1][model]
    http = httpclient.InferenceServerClient(served.url, concurrency=8)

    def one(start: int) -> httpclient.InferAsyncRequest:
        rows = X[start : start + 4]
        tensor = httpclient.InferInput("input__0", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        return http.async_infer(model, [tensor])

    # concurrent requests (dynamic batches) as tritonclient.http makes them: its client is not
    # thread-safe (a client shared by threads fails "greenlet.error: Cannot switch to a different thread")
    pending = [one(start) for start in range(0, len(X), 4)]
    answers = [request.get_result().as_numpy("output__0") for request in pending]
    np.testing.assert_array_equal(np.concatenate(answers), expected)
    grpc = grpcclient.InferenceServerClient(served.grpc_url)
    tensor = grpcclient.InferInput("input__0", [10, FEATURES], "FP32")
    tensor.set_data_from_numpy(X[:10])
    np.testing.assert_array_equal(grpc.infer(model, [tensor]).as_numpy("output__0"), expected[:10])


def test_fil_treeshap_output_equals_xgboosts_pred_contribs(served, models):
    expected = models[1]["fil_shap"]
    http = httpclient.InferenceServerClient(served.url, concurrency=8)

    def one(start: int) -> httpclient.InferAsyncRequest:
        tensor = httpclient.InferInput("input__0", [5, FEATURES], "FP32")
        tensor.set_data_from_numpy(X[start : start + 5])
        outputs = [httpclient.InferRequestedOutput(name) for name in ("output__0", "treeshap_output")]
        return http.async_infer("fil_shap", [tensor], outputs=outputs)

    results = [request.get_result() for request in [one(start) for start in range(0, 100, 5)]]
    np.testing.assert_array_equal(np.concatenate([r.as_numpy("treeshap_output") for r in results]), expected[:100])
    np.testing.assert_array_equal(
        np.concatenate([r.as_numpy("output__0") for r in results]), models[1]["fil_xgb"][:100]
    )
    grpc = grpcclient.InferenceServerClient(served.grpc_url)
    tensor = grpcclient.InferInput("input__0", [3, FEATURES], "FP32")
    tensor.set_data_from_numpy(X[:3])
    answer = grpc.infer("fil_shap", [tensor], outputs=[grpcclient.InferRequestedOutput("treeshap_output")])
    assert answer.as_numpy("output__0") is None
    np.testing.assert_array_equal(answer.as_numpy("treeshap_output"), expected[:3])


def test_openvino_answers_within_1e_5_of_onnxruntime(served, models):
    import onnxruntime as ort

    rows = np.random.default_rng(5).random((24, 256), dtype=np.float32)
    session = ort.InferenceSession(str(models[0] / "reference_mlp.onnx"))
    expected = session.run(None, {"INPUT0": rows})[0]
    http = httpclient.InferenceServerClient(served.url, concurrency=8)

    def one(start: int) -> httpclient.InferAsyncRequest:
        tensor = httpclient.InferInput("INPUT0", [3, 256], "FP32")
        tensor.set_data_from_numpy(rows[start : start + 3])
        return http.async_infer("ov_mlp", [tensor])

    pending = [one(start) for start in range(0, 24, 3)]
    got = np.concatenate([request.get_result().as_numpy("OUTPUT0") for request in pending])
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    grpc = grpcclient.InferenceServerClient(served.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [1, 256], "FP32")  # auto-completed: the model's own [?, 256]
    tensor.set_data_from_numpy(rows[:1])
    np.testing.assert_allclose(grpc.infer("ov_auto", [tensor]).as_numpy("OUTPUT0"), expected[:1], atol=1e-5, rtol=0)
    config = http.get_model_config("ov_auto")
    assert [(i["name"], i["dims"]) for i in config["input"]] == [("INPUT0", [-1, 256])]
    np.testing.assert_allclose(grpc.infer("ov_plain", [tensor]).as_numpy("OUTPUT0"), expected[:1], atol=1e-5, rtol=0)
    plain = http.get_model_config("ov_plain")
    assert (plain["backend"], plain["default_model_filename"]) == ("openvino", "model.xml")


def test_perf_analyzer_on_fil_and_openvino(perf_analyzer, served):
    perf_run(perf_analyzer, served.url, "-m", "fil_xgb", "-b", "4", "--concurrency-range", "4")
    perf_run(perf_analyzer, served.grpc_url, "-i", "grpc", "-m", "ov_mlp", "--concurrency-range", "4")

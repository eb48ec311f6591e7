"""FIL's `treeshap_output`: the SHAP values per feature and the bias, per class, equal to the
training library's own TreeSHAP (XGBoost's pred_contribs, what Triton's FIL QA compares with;
LightGBM's pred_contrib), in the config's dims, only when a request asks for them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from services.worker.backends import Placement, load_backend
from services.worker.backends.runner import Batch, Work
from shared.config import model_config
from shared.errors import ShoalError

xgb = pytest.importorskip("xgboost", reason="the FIL tests need the fil extra: pip install 'shoal[fil]'")
lgb = pytest.importorskip("lightgbm", reason="the FIL tests need the fil extra: pip install 'shoal[fil]'")
treelite = pytest.importorskip("treelite", reason="the FIL tests need the fil extra: pip install 'shoal[fil]'")
ensemble = pytest.importorskip("sklearn.ensemble", reason="the FIL tests need scikit-learn")

FEATURES = 6
RNG = np.random.default_rng(11)
X = RNG.random((200, FEATURES), dtype=np.float32)
BINARY = (X[:, 0] + X[:, 1] > 1).astype(int)
THREE = np.minimum((X[:, 2] * 3).astype(int), 2)
TARGET = X[:, 3] * 4 + X[:, 4]


def config(name: str, model_type: str, classifier: bool, outputs: int, shap_dims: str) -> str:
    return (
        f'name: "{name}"\nbackend: "fil"\nmax_batch_size: 64\n'
        f'input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }} ]\n'
        f'output [ {{ name: "output__0" data_type: TYPE_FP32 dims: [ {outputs} ] }},\n'
        f'  {{ name: "treeshap_output" data_type: TYPE_FP32 dims: [ {shap_dims} ] }} ]\n'
        f'parameters [ {{ key: "model_type" value: {{ string_value: "{model_type}" }} }},\n'
        f'  {{ key: "is_classifier" value: {{ string_value: "{str(classifier).lower()}" }} }} ]\n'
    )


def load(root: Path, text: str):
    parsed = model_config.parse_text(text)
    model_config.normalize(parsed)
    spec = model_config.spec_from_json(model_config.to_json(parsed))
    return load_backend("fil").create(spec, root / spec.name, Placement(1, "KIND_CPU", 0, 1, spec.name))


def run(instance, rows: np.ndarray, outputs: list[str]) -> list[dict[str, np.ndarray]]:
    parts = np.split(rows, [len(rows) // 3])  # two requests batched together
    return instance.execute(Batch([Work({"input__0": p}, outputs, len(p)) for p in parts]))


def shap(instance, rows: np.ndarray) -> np.ndarray:
    return np.concatenate([r["treeshap_output"] for r in run(instance, rows, ["output__0", "treeshap_output"])])


def version_dir(root: Path, name: str) -> Path:
    path = root / name / "1"
    path.mkdir(parents=True)
    return path


def test_xgboost_binary_and_regression_equal_pred_contribs(tmp_path):
    binary = xgb.train({"objective": "binary:logistic", "max_depth": 4}, xgb.DMatrix(X, label=BINARY), 15)
    binary.save_model(str(version_dir(tmp_path, "binary") / "xgboost.ubj"))
    instance = load(tmp_path, config("binary", "xgboost_ubj", True, 1, str(FEATURES + 1)))
    expected = binary.predict(xgb.DMatrix(X), pred_contribs=True)
    got = shap(instance, X)
    assert got.shape == (len(X), FEATURES + 1) and got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)
    # the values and the bias add up to the margin FIL's prediction is the sigmoid of
    np.testing.assert_allclose(got.sum(axis=1), binary.predict(xgb.DMatrix(X), output_margin=True), atol=1e-5)
    regression = xgb.train({"objective": "reg:squarederror"}, xgb.DMatrix(X, label=TARGET), 10)
    regression.save_model(str(version_dir(tmp_path, "reg") / "xgboost.json"))
    values = load(tmp_path, config("reg", "xgboost_json", False, 1, str(FEATURES + 1)))
    np.testing.assert_array_equal(shap(values, X), regression.predict(xgb.DMatrix(X), pred_contribs=True))


def test_xgboost_multiclass_answers_a_block_per_class(tmp_path):
    multi = xgb.train({"objective": "multi:softprob", "num_class": 3}, xgb.DMatrix(X, label=THREE), 8)
    multi.save_model(str(version_dir(tmp_path, "multi") / "xgboost.ubj"))
    expected = multi.predict(xgb.DMatrix(X), pred_contribs=True)  # (n, 3, features + 1)
    blocks = load(tmp_path, config("multi", "xgboost_ubj", True, 1, f"3, {FEATURES + 1}"))  # Triton QA's dims
    np.testing.assert_array_equal(shap(blocks, X), expected)
    flat = load(tmp_path, config("multi", "xgboost_ubj", True, 1, str(3 * (FEATURES + 1))))
    np.testing.assert_array_equal(shap(flat, X), expected.reshape(len(X), -1))


def test_lightgbm_equals_pred_contrib(tmp_path):
    booster = lgb.train({"objective": "multiclass", "num_class": 3, "verbose": -1}, lgb.Dataset(X, label=THREE), 8)
    booster.save_model(str(version_dir(tmp_path, "lgbm") / "model.txt"))
    instance = load(tmp_path, config("lgbm", "lightgbm", True, 1, f"3, {FEATURES + 1}"))
    expected = booster.predict(X, pred_contrib=True).reshape(len(X), 3, FEATURES + 1)
    np.testing.assert_allclose(shap(instance, X), expected, rtol=0, atol=1e-6)


def test_computed_only_when_asked(tmp_path):
    booster = xgb.train({"objective": "binary:logistic"}, xgb.DMatrix(X, label=BINARY), 3)
    booster.save_model(str(version_dir(tmp_path, "lazy") / "xgboost.ubj"))
    instance = load(tmp_path, config("lazy", "xgboost_ubj", True, 1, str(FEATURES + 1)))
    assert [sorted(answer) for answer in run(instance, X[:4], ["output__0"])] == [["output__0"]] * 2
    assert [sorted(answer) for answer in run(instance, X[:4], ["treeshap_output"])] == [["treeshap_output"]] * 2


def test_dims_that_do_not_hold_the_values_fail_the_request(tmp_path):
    booster = xgb.train({"objective": "binary:logistic"}, xgb.DMatrix(X, label=BINARY), 3)
    booster.save_model(str(version_dir(tmp_path, "short") / "xgboost.ubj"))
    instance = load(tmp_path, config("short", "xgboost_ubj", True, 1, str(FEATURES)))
    with pytest.raises(ShoalError, match=r"treeshap_output has 7 values per row .* hold 6"):
        run(instance, X[:4], ["treeshap_output"])


def test_a_treelite_model_is_refused_at_load(tmp_path):
    forest = ensemble.RandomForestClassifier(n_estimators=4, max_depth=3, random_state=0).fit(X, BINARY)
    treelite.sklearn.import_model(forest).serialize(str(version_dir(tmp_path, "forest") / "checkpoint.tl"))
    with pytest.raises(ShoalError, match="treeshap_output needs the model's own library"):
        load(tmp_path, config("forest", "treelite_checkpoint", True, 1, str(FEATURES + 1)))

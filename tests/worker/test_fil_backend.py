"""The FIL backend on tree models trained here: every model_type with Triton's default file
names, classes, probabilities and thresholds equal to the training library's own prediction,
FIL's parameter errors and warnings."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from services.worker.backends import Placement, load_backend
from services.worker.backends.fil_backend import FilParameters, postprocess, squeezed_shape
from services.worker.backends.runner import Batch, Work
from shared.config import model_config
from shared.errors import ShoalError

xgb = pytest.importorskip("xgboost", reason="the FIL tests need the fil extra: pip install 'shoal[fil]'")
lgb = pytest.importorskip("lightgbm", reason="the FIL tests need the fil extra: pip install 'shoal[fil]'")
treelite = pytest.importorskip("treelite", reason="the FIL tests need the fil extra: pip install 'shoal[fil]'")
ensemble = pytest.importorskip("sklearn.ensemble", reason="the FIL tests need scikit-learn")

FEATURES = 8
RNG = np.random.default_rng(7)
X = RNG.random((300, FEATURES), dtype=np.float32)
BINARY = (X[:, 0] + X[:, 1] > 1).astype(int)
THREE = np.minimum((X[:, 2] * 3).astype(int), 2)
TARGET = X[:, 3] * 4 + X[:, 4]


def config(name: str, params: dict[str, str], outputs: int = 1) -> str:
    entries = ", ".join(f'{{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items())
    return (
        f'name: "{name}"\nbackend: "fil"\nmax_batch_size: 64\n'
        f'input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }} ]\n'
        f'output [ {{ name: "output__0" data_type: TYPE_FP32 dims: [ {outputs} ] }} ]\n'
        f"parameters [ {entries} ]\n"
    )


def load(root: Path, text: str):
    parsed = model_config.parse_text(text)
    model_config.normalize(parsed)
    spec = model_config.spec_from_json(model_config.to_json(parsed))
    return load_backend("fil").create(spec, root / spec.name, Placement(1, "KIND_CPU", 0, 1, spec.name))


def predict(instance, rows: np.ndarray) -> np.ndarray:
    sizes = [len(rows) // 2, len(rows) - len(rows) // 2]  # two requests batched together
    parts = np.split(rows, [sizes[0]])
    results = instance.execute(Batch([Work({"input__0": p}, ["output__0"], len(p)) for p in parts]))
    return np.concatenate([r["output__0"] for r in results])


def version_dir(root: Path, name: str) -> Path:
    path = root / name / "1"
    path.mkdir(parents=True)
    return path


@pytest.mark.parametrize(
    "model_type, filename",
    [("xgboost_ubj", "xgboost.ubj"), ("xgboost_json", "xgboost.json"), ("xgboost", "xgboost.model")],
)
# xgboost warns that a file named without .json or .ubj is saved as UBJSON: Triton's FIL default
# file name for model_type xgboost is xgboost.model, which is the point of this case
@pytest.mark.filterwarnings("ignore:.*Saving model in the UBJSON format as default:UserWarning")
def test_xgboost_binary_classifier_classes_and_probabilities(tmp_path, model_type, filename):
    booster = xgb.train({"objective": "binary:logistic", "max_depth": 4}, xgb.DMatrix(X, label=BINARY), 20)
    booster.save_model(str(version_dir(tmp_path, model_type) / filename))
    own = booster.inplace_predict(X)
    classes = load(tmp_path, config(model_type, {"model_type": model_type, "is_classifier": "true"}))
    np.testing.assert_array_equal(predict(classes, X), (own > 0.5).astype(np.float32))
    proba = load(
        tmp_path, config(model_type, {"model_type": model_type, "is_classifier": "true", "predict_proba": "true"}, 2)
    )
    np.testing.assert_array_equal(predict(proba, X), np.stack([1 - own, own], axis=1))
    strict = load(tmp_path, config(model_type, {"model_type": model_type, "is_classifier": "true", "threshold": "0.9"}))
    np.testing.assert_array_equal(predict(strict, X), (own > 0.9).astype(np.float32))


def test_xgboost_multiclass_and_regression_equal_xgboost(tmp_path):
    multi = xgb.train({"objective": "multi:softprob", "num_class": 3}, xgb.DMatrix(X, label=THREE), 10)
    multi.save_model(str(version_dir(tmp_path, "multi") / "xgboost.ubj"))
    probs = multi.inplace_predict(X)
    proba = load(
        tmp_path, config("multi", {"model_type": "xgboost_ubj", "is_classifier": "true", "predict_proba": "true"}, 3)
    )
    np.testing.assert_array_equal(predict(proba, X), probs)
    classes = load(tmp_path, config("multi", {"model_type": "xgboost_ubj", "is_classifier": "true"}))
    np.testing.assert_array_equal(predict(classes, X), np.argmax(probs, axis=1).astype(np.float32))
    regression = xgb.train({"objective": "reg:squarederror"}, xgb.DMatrix(X, label=TARGET), 15)
    regression.save_model(str(version_dir(tmp_path, "reg") / "xgboost.json"))
    values = load(tmp_path, config("reg", {"model_type": "xgboost_json", "is_classifier": "false"}))
    np.testing.assert_array_equal(predict(values, X), regression.inplace_predict(X))


def test_lightgbm_classifier_equals_lightgbm(tmp_path):
    booster = lgb.train({"objective": "multiclass", "num_class": 3, "verbose": -1}, lgb.Dataset(X, label=THREE), 10)
    booster.save_model(str(version_dir(tmp_path, "lgbm") / "model.txt"))
    probs = booster.predict(X).astype(np.float32)
    proba = load(
        tmp_path, config("lgbm", {"model_type": "lightgbm", "output_class": "true", "predict_proba": "true"}, 3)
    )
    np.testing.assert_array_equal(predict(proba, X), probs)


def test_scikit_learn_forest_through_a_treelite_checkpoint(tmp_path):
    forest = ensemble.RandomForestClassifier(n_estimators=8, max_depth=5, random_state=0).fit(X, BINARY)
    model = treelite.sklearn.import_model(forest)
    model.serialize(str(version_dir(tmp_path, "forest") / "checkpoint.tl"))
    expected = treelite.gtil.predict(model, X).reshape(len(X), -1)
    proba = load(
        tmp_path,
        config("forest", {"model_type": "treelite_checkpoint", "is_classifier": "true", "predict_proba": "true"}, 2),
    )
    got = predict(proba, X)
    np.testing.assert_array_equal(got, expected.astype(np.float32))  # treelite's own prediction, exactly
    np.testing.assert_allclose(got, forest.predict_proba(X), atol=1e-6)  # and scikit-learn's


def test_treelite_predictor_on_request(tmp_path):
    booster = lgb.train({"objective": "binary", "verbose": -1}, lgb.Dataset(X, label=BINARY), 10)
    booster.save_model(str(version_dir(tmp_path, "lgbm_tl") / "model.txt"))
    params = {
        "model_type": "lightgbm",
        "is_classifier": "true",
        "predict_proba": "true",
        "shoal.fil_predictor": "treelite",
    }
    instance = load(tmp_path, config("lgbm_tl", params))
    assert instance.predictor.library == "treelite"
    np.testing.assert_array_equal(predict(instance, X), booster.predict(X).astype(np.float32))


def test_fil_parameter_errors_and_warnings(tmp_path, caplog):
    with pytest.raises(ShoalError, match="pickle not recognized as a valid serialization format."):
        load(tmp_path, config("a", {"model_type": "pickle", "is_classifier": "true"}))
    with pytest.raises(ShoalError, match="Required parameter is_classifier not found in config"):
        load(tmp_path, config("b", {"model_type": "xgboost_ubj"}))
    with pytest.raises(ShoalError, match="Bad input for parameter is_classifier"):
        load(tmp_path, config("c", {"model_type": "xgboost_ubj", "is_classifier": "yes"}))
    booster = xgb.train({"objective": "binary:logistic"}, xgb.DMatrix(X, label=BINARY), 3)
    booster.save_model(str(version_dir(tmp_path, "gpu_params") / "xgboost.ubj"))
    with caplog.at_level(logging.WARNING, logger="shoal.worker"):
        load(
            tmp_path,
            config(
                "gpu_params",
                {"model_type": "xgboost_ubj", "is_classifier": "true", "layout": "breadth_first", "chunk_size": "4"},
            ),
        )
    assert "`layout` applies to GPU execution only" in caplog.text and "`chunk_size`" in caplog.text
    with pytest.raises(ShoalError, match="unable to find"):
        load(tmp_path, config("gpu_params", {"model_type": "lightgbm", "is_classifier": "true"}))


def test_postprocess_matches_fil():
    scores = np.array([[0.2], [0.7]], np.float32)
    binary = FilParameters("xgboost", True, False, 0.5, False, -1, "library")
    np.testing.assert_array_equal(postprocess(scores, binary, 1), [[0.0], [1.0]])
    proba = FilParameters("xgboost", True, True, 0.5, False, -1, "library")
    np.testing.assert_allclose(postprocess(scores, proba, 2), [[0.8, 0.2], [0.3, 0.7]])
    np.testing.assert_array_equal(postprocess(scores, proba, 1), scores)


@pytest.mark.parametrize(
    "dims, shape",
    [((1,), [-1]), ((2,), [-1, 2]), ((3, 1), [-1, 3]), ((-1, 1), [-1]), ((1, 1), [-1]), ((), [-1])],
)
def test_outputs_are_squeezed_as_fils(dims, shape):
    """rapids-triton's squeeze_output, which FIL's backend sets: a regression's (or a class per
    row's) dims [1] answer [n], not [n, 1]."""
    assert squeezed_shape(dims) == shape


def test_a_regression_answers_one_value_per_row(tmp_path):
    regression = xgb.train({"objective": "reg:squarederror"}, xgb.DMatrix(X, label=TARGET), 5)
    regression.save_model(str(version_dir(tmp_path, "reg1") / "xgboost.json"))
    values = load(tmp_path, config("reg1", {"model_type": "xgboost_json", "is_classifier": "false"}))
    assert predict(values, X[:10]).shape == (10,)

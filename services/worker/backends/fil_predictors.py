"""Tree models on the CPU for the FIL backend: the training library's own predictor, or treelite's.

Every predictor answers the same thing for a float32 batch: an (n, k) array of what the model
predicts per row after its objective's transform (probabilities for a classifier, one column
for binary classification and regression, k classes otherwise), the way Triton's FIL reads
GTIL's output before its classifier post-processing (fil_backend.py).

The library's own predictor is the default when it is installed: XGBoost's `inplace_predict`
and LightGBM's `predict` give exactly the library's prediction (treelite's GTIL sums the trees
in another order, a few ulps apart on XGBoost models). LightGBM's is faster than GTIL at every
batch size; XGBoost's pays a fixed cost per call and wins from a few dozen rows on (docs/models.md,
"FIL and OpenVINO: measured"). Treelite loads every FIL
format (and scikit-learn forests through its checkpoints), so it runs whatever has no
library installed, and `treelite_checkpoint` models always.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Protocol

import numpy as np

from shared.errors import Code, ShoalError, unavailable, unsupported

log = logging.getLogger("shoal.worker")
EXTRA = "pip install 'shoal[fil]'"


class Predictor(Protocol):
    """What the FIL backend asks of a predictor, whichever library's it is (`load`)."""

    library: str

    def predict(self, rows: np.ndarray) -> np.ndarray: ...

    def contributions(self, rows: np.ndarray) -> np.ndarray:
        """SHAP values (n, classes, features + 1) in the margin's space, the bias last (FIL's
        `treeshap_output`)."""
        ...


def _unknown(message: str) -> ShoalError:
    return ShoalError(message, Code.UNKNOWN)  # FIL's loaders report treelite's errors as UNKNOWN


class XGBoostPredictor:
    library = "xgboost"

    def __init__(self, path: Path, threads: int) -> None:
        import xgboost

        self.booster = xgboost.Booster()
        try:
            self.booster.load_model(bytearray(path.read_bytes()))  # the format is read from the bytes
        except xgboost.core.XGBoostError as exc:
            raise _unknown(f"cannot load the XGBoost model {path.name}: {str(exc).splitlines()[0]}") from None
        self.booster.set_param({"nthread": threads})
        learner = json.loads(self.booster.save_config())["learner"]
        self.softmax = learner["objective"]["name"] == "multi:softmax"  # predicts a class, not probabilities

    def predict(self, rows: np.ndarray) -> np.ndarray:
        if self.softmax:  # the class probabilities FIL's predict_proba and argmax work on
            margins = np.asarray(self.booster.inplace_predict(rows, predict_type="margin"), dtype=np.float64)
            exp = np.exp(margins - margins.max(axis=1, keepdims=True))
            return (exp / exp.sum(axis=1, keepdims=True)).astype(np.float32)
        return np.asarray(self.booster.inplace_predict(rows)).reshape(len(rows), -1)

    def contributions(self, rows: np.ndarray) -> np.ndarray:
        import xgboost

        # XGBoost's own TreeSHAP (what Triton's FIL QA compares treeshap_output with)
        values = self.booster.predict(xgboost.DMatrix(rows), pred_contribs=True)
        return np.asarray(values, dtype=np.float32).reshape(len(rows), -1, rows.shape[1] + 1)


class LightGBMPredictor:
    library = "lightgbm"

    def __init__(self, path: Path, threads: int) -> None:
        import lightgbm

        try:
            self.booster = lightgbm.Booster(model_file=str(path))
        except lightgbm.basic.LightGBMError as exc:
            raise _unknown(f"cannot load the LightGBM model {path.name}: {exc}") from None
        self.threads = threads

    def predict(self, rows: np.ndarray) -> np.ndarray:
        result = self.booster.predict(rows, num_threads=self.threads)
        return np.asarray(result).reshape(len(rows), -1)

    def contributions(self, rows: np.ndarray) -> np.ndarray:
        values = self.booster.predict(rows, num_threads=self.threads, pred_contrib=True)  # (n, k * (f + 1))
        return np.asarray(values, dtype=np.float32).reshape(len(rows), -1, rows.shape[1] + 1)


class TreelitePredictor:
    library = "treelite"

    def __init__(self, path: Path, model_type: str, threads: int, allow_unknown_field: bool) -> None:
        import treelite

        frontend = treelite.frontend
        try:
            if model_type == "treelite_checkpoint":
                self.model = treelite.Model.deserialize(str(path))
            elif model_type == "lightgbm":
                self.model = frontend.load_lightgbm_model(str(path))
            elif model_type == "xgboost":
                self.model = frontend.load_xgboost_model_legacy_binary(str(path))
            else:
                choice = "json" if model_type == "xgboost_json" else "ubjson"
                self.model = frontend.load_xgboost_model(
                    str(path), format_choice=choice, allow_unknown_field=allow_unknown_field
                )
        except treelite.TreeliteError as exc:
            raise _unknown(str(exc).strip().splitlines()[-1]) from None
        if self.model.num_tree == 0:
            raise _unknown(f"the model in {path.name} has no trees")
        self.gtil = treelite.gtil
        self.threads = threads

    def predict(self, rows: np.ndarray) -> np.ndarray:
        result = self.gtil.predict(self.model, rows, nthread=self.threads)
        return np.asarray(result).reshape(len(rows), -1)  # (n, targets, classes): one target here

    def contributions(self, rows: np.ndarray) -> np.ndarray:
        raise unsupported("treelite computes no SHAP values")  # refused at load (fil_backend.treeshap_shape)


def load(path: Path, model_type: str, threads: int, allow_unknown_field: bool, choice: str) -> Predictor:
    """The predictor for `model_type`: `choice` "library" (the default: the training library's
    own, treelite when that is not installed) or "treelite"."""
    library = {"xgboost": "xgboost", "xgboost_json": "xgboost", "xgboost_ubj": "xgboost", "lightgbm": "lightgbm"}
    wanted = library.get(model_type) if choice == "library" else None
    if wanted is not None:
        try:
            if wanted == "xgboost":
                return XGBoostPredictor(path, threads)
            return LightGBMPredictor(path, threads)
        except ImportError:
            log.info("%s is not installed: %s runs on treelite", wanted, path)
        except ShoalError:
            if model_type != "xgboost":
                raise
            # XGBoost 3 reads JSON and UBJSON only; treelite still reads the legacy binary format
            log.info("%s is not a model XGBoost reads: treelite reads it as XGBoost's legacy binary format", path)
    try:
        return TreelitePredictor(path, model_type, threads, allow_unknown_field)
    except ImportError:
        raise unavailable(f"the FIL backend needs treelite (and xgboost, lightgbm for their models): {EXTRA}") from None

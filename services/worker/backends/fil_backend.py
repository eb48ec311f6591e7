"""Triton's FIL backend (`backend: "fil"`): XGBoost, LightGBM and treelite tree models, on the CPU.

The config reads as Triton's FIL backend reads it: input `input__0` FP32 [features], output
`output__0` FP32; `parameters` `model_type` (`xgboost` (default), `xgboost_json`,
`xgboost_ubj`, `lightgbm`, `treelite_checkpoint`) with its default file name (`xgboost.model`,
`xgboost.json`, `xgboost.ubj`, `model.txt`, `checkpoint.tl`), `is_classifier` (required;
`output_class`, its older name, still read), `predict_proba`, `threshold` (binary
classifiers, default 0.5), `xgboost_allow_unknown_field`, `cpu_nthread`. The GPU-only
parameters (`chunk_size`, `layout`, `transfer_threshold`) and the removed ones are accepted
with a warning. A classifier answers its class (argmax, or probability > threshold for a
binary one) unless `predict_proba` asks for the probabilities ([1-p, p] when the output has
two columns). An output `treeshap_output` (FP32, dims features + 1, or classes x (features + 1))
answers the SHAP values of each feature and the bias, per class, in the margin's space, as FIL's
explainability output: the library's own TreeSHAP (XGBoost's `pred_contribs`, LightGBM's
`pred_contrib`); a model only treelite runs has none (the load says so). Batching, instance
groups and every scheduler feature apply as to any model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.worker.backends import Backend, Placement, fil_predictors, model_path
from services.worker.backends.runner import BatchedRunner, Tensors
from shared.config.model_config import ModelSpec
from shared.errors import invalid, unsupported

log = logging.getLogger("shoal.worker")

DEFAULT_FILES = {
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
}
GPU_ONLY = ("chunk_size", "layout", "transfer_threshold")
REMOVED = {"algo": "layout", "threads_per_tree": "chunk_size", "storage_type": "", "blocks_per_sm": ""}
INPUT, OUTPUT = "input__0", "output__0"
SHAP = "treeshap_output"  # FIL's explainability output (docs/explainability.md of Triton's FIL backend)


@dataclass(frozen=True)
class FilParameters:
    model_type: str
    is_classifier: bool
    predict_proba: bool
    threshold: float
    allow_unknown_field: bool
    cpu_nthread: int
    predictor: str  # Shoal's own `shoal.fil_predictor`: "library" (default) or "treelite"


def _bool(spec: ModelSpec, key: str, default: bool | None) -> bool:
    """A boolean as FIL reads one (std::boolalpha: exactly `true` or `false`)."""
    value = spec.parameters.get(key)
    if value is None:
        if default is None:
            raise invalid(f"Required parameter {key} not found in config")
        return default
    if value.strip() not in ("true", "false"):
        if default is None:
            raise invalid(f"Bad input for parameter {key}")
        return default
    return value.strip() == "true"


def _number(spec: ModelSpec, key: str, default: float) -> float:
    try:
        return float(spec.parameters.get(key, default))
    except ValueError:
        return default  # FIL falls back to the default when a value with one does not parse


def parse(spec: ModelSpec) -> FilParameters:
    """The FIL parameters of a config, with FIL's errors and warnings."""
    model_type = spec.parameters.get("model_type", "xgboost")
    if model_type not in DEFAULT_FILES:
        raise unsupported(f"{model_type} not recognized as a valid serialization format.")
    for removed, instead in REMOVED.items():
        if spec.parameters.get(removed):
            use = f" Use `{instead}` instead." if instead else ""
            log.warning("model '%s': the `%s` parameter has been removed in 25.09 release.%s", spec.name, removed, use)
    if spec.parameters.get("use_experimental_optimizations"):
        log.warning("model '%s': use_experimental_optimizations option is deprecated.", spec.name)
    for key in GPU_ONLY:
        if spec.parameters.get(key):
            log.warning(
                "model '%s': the FIL parameter `%s` applies to GPU execution only; Shoal runs FIL on the CPU",
                spec.name,
                key,
            )
    if spec.parameters.get("output_class"):  # the older name of is_classifier
        log.warning(
            "model '%s': the `output_class` parameter has been removed in 25.09 release. Use `is_classifier` instead.",
            spec.name,
        )
        is_classifier = _bool(spec, "output_class", None)
    else:
        is_classifier = _bool(spec, "is_classifier", None)
    predictor = spec.parameters.get("shoal.fil_predictor", "library")
    if predictor not in ("library", "treelite"):
        raise invalid(
            f"model '{spec.model_name}': shoal.fil_predictor must be 'library' or 'treelite', got '{predictor}'"
        )
    return FilParameters(
        model_type=model_type,
        is_classifier=is_classifier,
        predict_proba=_bool(spec, "predict_proba", False),
        threshold=_number(spec, "threshold", 0.5) if is_classifier else 0.5,
        allow_unknown_field=_bool(spec, "xgboost_allow_unknown_field", False),
        cpu_nthread=int(_number(spec, "cpu_nthread", -1)),
        predictor=predictor,
    )


def postprocess(scores: np.ndarray, params: FilParameters, columns: int) -> np.ndarray:
    """FIL's output from the model's (n, k) predictions: classes, probabilities or values."""
    classes = scores.shape[1]
    if not params.is_classifier:
        return scores.astype(np.float32, copy=False)
    if params.predict_proba:
        if classes == 1 and columns == 2:  # a binary model's one probability as [1 - p, p]
            positive = scores[:, 0].astype(np.float32)
            return np.stack([1.0 - positive, positive], axis=1)
        return scores.astype(np.float32, copy=False)
    if classes > 1:
        return np.argmax(scores, axis=1).astype(np.float32).reshape(-1, 1)
    return (scores[:, :1] > params.threshold).astype(np.float32)


def squeezed_shape(dims: tuple[int, ...]) -> list[int]:
    """FIL's answer's shape (rapids-triton's `SharedModelState` with squeeze_output, which FIL's
    backend asks for): the config's output shape (its reshape if any) after a batch dimension (-1),
    every 1 taken out: dims [1] (a regression, or a class per row) answer [n], [2] answer [n, 2]."""
    shape = list(dims) if dims and dims[0] == -1 else [-1, *dims]
    return [d for d in shape if d != 1]


def treeshap_shape(spec: ModelSpec, library: str) -> list[int] | None:
    """The shape `treeshap_output` answers in, if the config has it: FIL's SHAP values per row, one
    (features + 1) block per class (the bias last), in the config's dims (squeezed as the output)."""
    output = spec.output(SHAP)
    if output is None:
        return None
    if output.datatype != "FP32":
        raise invalid(f"model '{spec.model_name}': {SHAP} must be TYPE_FP32, got TYPE_{output.datatype}")
    if library == "treelite":
        raise unsupported(
            f"model '{spec.model_name}': {SHAP} needs the model's own library (xgboost or lightgbm): treelite, "
            "which runs this model, computes no SHAP values"
        )
    return squeezed_shape(output.reshape if output.reshape is not None else output.dims)


class FilInstance(BatchedRunner):
    def __init__(self, spec: ModelSpec, version_dir: Path, placement: Placement) -> None:
        super().__init__(spec)
        self.params = parse(spec)
        output = spec.output(OUTPUT)
        if spec.input(INPUT) is None or output is None:
            raise invalid(
                f"model '{spec.model_name}': the FIL backend reads input '{INPUT}' and answers output '{OUTPUT}'"
            )
        if placement.kind == "KIND_GPU":
            log.warning(
                "model '%s' instance '%s': Shoal runs FIL on the CPU (KIND_GPU asked)", spec.name, placement.name
            )
        self.columns = int(np.prod([d for d in output.dims if d > 0])) if output.dims else 1
        self.shape = squeezed_shape(output.reshape if output.reshape is not None else output.dims)
        path = model_path(spec, version_dir.parent, placement.version, DEFAULT_FILES[self.params.model_type], True)
        threads = self.params.cpu_nthread if self.params.cpu_nthread > 0 else placement.threads
        self.predictor = fil_predictors.load(
            path, self.params.model_type, threads, self.params.allow_unknown_field, self.params.predictor
        )
        log.info("model '%s': FIL predicts with %s, %d thread(s)", spec.name, self.predictor.library, threads)
        self.shap_shape = treeshap_shape(spec, self.predictor.library)

    def run(self, inputs: Tensors, output_names: list[str]) -> Tensors:
        rows = np.ascontiguousarray(inputs[INPUT], dtype=np.float32)
        rows = rows.reshape(len(rows), -1)
        answer: Tensors = {}
        if OUTPUT in output_names:
            result = postprocess(self.predictor.predict(rows), self.params, self.columns)
            answer[OUTPUT] = result.reshape([len(rows) if d < 0 else d for d in self.shape])
        if SHAP in output_names and self.shap_shape is not None:
            answer[SHAP] = self._shap(rows)
        return answer

    def _shap(self, rows: np.ndarray) -> np.ndarray:
        values = self.predictor.contributions(rows)  # (n, classes, features + 1)
        assert self.shap_shape is not None
        if -1 in self.shap_shape[1:]:  # variable dims: each row's blocks as they come
            return values.reshape([len(rows), *[d for d in values.shape[1:] if d != 1]])
        shape = [len(rows) if d < 0 else d for d in self.shap_shape]
        if values.size != int(np.prod(shape)):
            per_row, classes = values.size // len(rows), values.shape[1]
            raise invalid(
                f"model '{self.spec.model_name}': {SHAP} has {per_row} values per row ({classes} class(es) x "
                f"{rows.shape[1] + 1}: the features and the bias), its dims in the model configuration "
                f"hold {int(np.prod(shape)) // len(rows)}"
            )
        return values.reshape(shape)

    def close(self) -> None:
        del self.predictor


# the version directory comes in (the model file depends on `model_type`); instances share the cores
BACKEND = Backend("", FilInstance, shares_cores=True)

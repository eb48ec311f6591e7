"""A model's `model_metrics` in config.pbtxt: its own histogram buckets, as Triton's core checks
them at load (model_config_utils.cc `ValidateModelMetrics`) and reads them into the model's
metric reporter (metric_model_reporter.cc)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shared.errors import invalid

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2 as pb

log = logging.getLogger("shoal.config")

FIRST_RESPONSE_HISTOGRAM = "nv_inference_first_response_histogram_ms"
FIRST_RESPONSE_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)  # Triton's default boundaries
# the families a model may give its own buckets: Triton's core histograms (one so far)
CUSTOMIZABLE = frozenset({FIRST_RESPONSE_HISTOGRAM})


def validate_model_metrics(config: pb.ModelConfig) -> None:
    """Triton's load-time checks, with its messages; plus strictly ascending buckets, which
    prometheus-cpp demands (it throws on any other order)."""
    for control in config.model_metrics.metric_control:
        if not control.HasField("metric_identifier"):
            raise invalid("metric control must specify 'metric_identifier'")
        family = control.metric_identifier.family
        if not family:
            raise invalid("metric identifier must specify non-empty 'family'")
        if not control.HasField("histogram_options"):
            raise invalid("metric control must specify 'histogram_options'")
        buckets = list(control.histogram_options.buckets)
        if not buckets:
            raise invalid("histogram options must specify non-empty 'buckets'")
        if any(upper <= lower for lower, upper in zip(buckets, buckets[1:])):
            raise invalid(f"histogram options of '{family}' must list 'buckets' in strictly ascending order")
        if family not in CUSTOMIZABLE:  # a warning in Triton too: the model still loads
            log.warning(
                "Metric family '%s' in 'metric_identifier' is not a customizable metric in Triton core.", family
            )


def histogram_buckets(config: Mapping[str, Any], family: str, default: tuple[float, ...]) -> tuple[float, ...]:
    """The upper bounds `config` (the model's JSON) gives `family`'s histogram, else `default`;
    where several entries name it the last wins, as each overrides the one before in Triton."""
    buckets = default
    for control in config.get("model_metrics", {}).get("metric_control", []):
        if control.get("metric_identifier", {}).get("family") == family:
            given = control.get("histogram_options", {}).get("buckets", [])
            buckets = tuple(float(b) for b in given) or buckets
    return buckets


def first_response_buckets(config: Mapping[str, Any]) -> tuple[float, ...]:
    return histogram_buckets(config, FIRST_RESPONSE_HISTOGRAM, FIRST_RESPONSE_BUCKETS_MS)

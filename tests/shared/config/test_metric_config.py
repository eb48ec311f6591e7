"""shared/config/metric_config.py: `model_metrics` as Triton's core checks and reads it (the
qa/L0_model_config/model_metrics cases, and L0_metrics' bucket override)."""

from __future__ import annotations

import logging

import pytest

from shared.config import model_config as mc
from shared.config.metric_config import FIRST_RESPONSE_BUCKETS_MS, first_response_buckets
from shared.errors import ShoalError

BASE = 'name: "m"\nbackend: "python"\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
FAMILY = 'metric_identifier: { family: "nv_inference_first_response_histogram_ms" }'


def _config(controls: str) -> dict:
    config = mc.parse_text(BASE + f"model_metrics {{ metric_control: [ {controls} ] }}\n")
    mc.normalize(config)
    mc.validate(config)
    return mc.to_json(config)


def test_the_buckets_of_l0_metrics_override_are_read_from_the_json():
    config = _config(f"{{ {FAMILY} histogram_options: {{ buckets: [ -1, 0.0, 1, 2.5 ] }} }}")
    assert first_response_buckets(config) == (-1.0, 0.0, 1.0, 2.5)


def test_without_model_metrics_the_defaults_hold():
    config = mc.parse_text(BASE)
    mc.normalize(config)
    assert first_response_buckets(mc.to_json(config)) == FIRST_RESPONSE_BUCKETS_MS == (100, 500, 2000, 5000)


@pytest.mark.parametrize(
    ("controls", "message"),
    [
        ("{ histogram_options: { buckets: [ 1 ] } }", "metric control must specify 'metric_identifier'"),
        (
            '{ metric_identifier: { family: "" } histogram_options: { buckets: [ 1 ] } }',
            "metric identifier must specify non-empty 'family'",
        ),
        (f"{{ {FAMILY} }}", "metric control must specify 'histogram_options'"),
        (f"{{ {FAMILY} histogram_options: {{ buckets: [] }} }}", "histogram options must specify non-empty 'buckets'"),
        (f"{{ {FAMILY} histogram_options: {{ }} }}", "histogram options must specify non-empty 'buckets'"),
        (f"{{ {FAMILY} histogram_options: {{ buckets: [ 2, 1 ] }} }}", "strictly ascending"),
    ],
)
def test_an_invalid_model_metrics_fails_the_load_with_tritons_message(controls: str, message: str):
    with pytest.raises(ShoalError) as err:
        _config(controls)
    assert message in err.value.message


def test_an_unknown_family_is_a_warning_and_its_buckets_are_ignored(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.WARNING):
        config = _config('{ metric_identifier: { family: "no_such" } histogram_options: { buckets: [ 1 ] } }')
    assert "Metric family 'no_such' in 'metric_identifier' is not a customizable metric" in caplog.text
    assert first_response_buckets(config) == FIRST_RESPONSE_BUCKETS_MS

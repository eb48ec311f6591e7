"""Python models' custom metrics: merged across workers and rendered as Prometheus text."""

from prometheus_client.parser import text_string_to_metric_families

from services.gateway.metrics.custom import merge, render_custom
from services.worker.python import pb_metrics, pb_utils


def snapshot(value: float, observed: list[float]) -> list[dict]:
    return [
        {
            "name": "c",
            "description": "a counter",
            "kind": "counter",
            "samples": [{"labels": {"m": "x"}, "value": value, "buckets": [], "counts": [0], "sum": 0.0}],
        },
        {
            "name": "h",
            "description": "a histogram",
            "kind": "histogram",
            "samples": [
                {
                    "labels": {},
                    "value": 0.0,
                    "buckets": [1.0, 10.0],
                    "counts": [
                        sum(v <= 1 for v in observed),
                        sum(1 < v <= 10 for v in observed),
                        sum(v > 10 for v in observed),
                    ],
                    "sum": sum(observed),
                }
            ],
        },
    ]


def test_samples_of_several_workers_add_up():
    text = "\n".join(render_custom(merge([snapshot(2, [0.5, 20]), snapshot(3, [5])]))) + "\n"
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert [(s.labels, s.value) for s in families["c"].samples] == [({"m": "x"}, 5.0)]
    buckets = {s.labels.get("le"): s.value for s in families["h"].samples if s.name == "h_bucket"}
    assert buckets == {"1": 1.0, "10": 2.0, "+Inf": 3.0}
    assert next(s.value for s in families["h"].samples if s.name == "h_sum") == 25.5


def test_metric_family_rules():
    family = pb_utils.MetricFamily("test_gauge_rules", "g", pb_utils.MetricFamily.GAUGE)
    metric = family.Metric(labels={"a": "1"})
    metric.set(4)
    metric.increment(-1)
    assert metric.value() == 3 and family.Metric(labels={"a": "1"}) is metric
    counter = pb_utils.MetricFamily("test_counter_rules", "c", pb_utils.MetricFamily.COUNTER).Metric()
    for call in (
        lambda: counter.increment(-1),
        lambda: counter.set(1),
        lambda: counter.observe(1),
        lambda: pb_utils.MetricFamily("bad name", "x", pb_utils.MetricFamily.COUNTER),
        lambda: pb_utils.MetricFamily("test_gauge_rules", "g", pb_utils.MetricFamily.COUNTER),
    ):
        try:
            call()
        except pb_utils.TritonModelException:
            continue
        raise AssertionError("accepted")
    names = {f["name"] for f in pb_utils.metrics_snapshot()}
    assert {"test_gauge_rules", "test_counter_rules"} <= names


def test_non_finite_values_and_odd_text_still_render():
    snapshot = [
        {
            "name": "g",
            "description": "two\nlines",
            "kind": "gauge",
            "samples": [{"labels": {"path": 'a"b\nc'}, "value": "NaN", "buckets": [], "counts": [0], "sum": 0}],
        }
    ]
    text = "\n".join(render_custom(merge([snapshot, snapshot]))) + "\n"
    (family,) = text_string_to_metric_families(text)
    (sample,) = family.samples
    assert sample.labels == {"path": 'a"b\nc'} and sample.value != sample.value  # NaN
    assert merge(
        [
            [
                {
                    "name": "x",
                    "description": "",
                    "kind": "counter",
                    "samples": [{"labels": {}, "value": "+Inf", "buckets": [], "counts": [0], "sum": 0}],
                }
            ]
        ]
    )["x"]["samples"][()]["value"] == float("inf")
    assert pb_metrics._number(float("nan")) == "NaN" and pb_metrics._number(2.5) == 2.5

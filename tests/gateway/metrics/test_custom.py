"""Python models' custom metrics: merged across workers and rendered as Prometheus text."""

import math

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from services.gateway.metrics.custom import merge, render_custom
from services.worker.python.triton_api import pb_utils
from shared.wire.control import MetricSample, MetricSnapshot, WorkerMetrics
from shared.wire.messages import encode


def snapshot(value: float, observed: list[float]) -> list[MetricSnapshot]:
    counts = [sum(v <= 1 for v in observed), sum(1 < v <= 10 for v in observed), sum(v > 10 for v in observed)]
    return [
        MetricSnapshot("c", "a counter", "counter", [MetricSample({"m": "x"}, value, [], [0], 0.0)]),
        MetricSnapshot("h", "a histogram", "histogram", [MetricSample({}, 0.0, [1.0, 10.0], counts, sum(observed))]),
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
    names = {f.name for f in pb_utils.metrics_snapshot()}
    assert {"test_gauge_rules", "test_counter_rules"} <= names


def test_non_finite_values_and_odd_text_still_render():
    snapshot = [MetricSnapshot("g", "two\nlines", "gauge", [MetricSample({"path": 'a"b\nc'}, math.nan, [], [0])])]
    text = "\n".join(render_custom(merge([snapshot, snapshot]))) + "\n"
    (family,) = text_string_to_metric_families(text)
    (sample,) = family.samples
    assert sample.labels == {"path": 'a"b\nc'} and sample.value != sample.value  # NaN
    infinite = [MetricSnapshot("x", "", "counter", [MetricSample({}, math.inf, [], [0])])]
    assert merge([infinite])["x"].samples[()].value == math.inf


def test_a_snapshot_crosses_the_wire_whole():
    """MessagePack carries NaN and infinities (JSON would not); the gateway decodes the worker's encoding."""
    family = pb_utils.MetricFamily("test_wire_gauge", "g", pb_utils.MetricFamily.GAUGE)
    family.Metric(labels={"k": "v"}).set(math.inf)
    sent = WorkerMetrics("w1", pb_utils.metrics_snapshot())
    received = msgspec.msgpack.decode(encode(sent), type=WorkerMetrics)
    (gauge,) = [f for f in received.families if f.name == "test_wire_gauge"]
    assert gauge.samples == [MetricSample({"k": "v"}, math.inf, [], [0], 0.0)]

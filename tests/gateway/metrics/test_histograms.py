"""The first-response histogram and the load-time gauge as Triton writes them (prometheus-cpp's
exposition) and as qa/L0_metrics reads them: `_count`, `_sum`, then `_bucket`s, `le` last."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from services.gateway.metrics.endpoint import MetricsOptions, render
from services.gateway.metrics.prometheus_text import double_text
from shared.wire.control import LoadTime, ModelFigures
from shared.wire.statistics import Latency, ModelStatistics, VersionStatistics

HISTOGRAM = "nv_inference_first_response_histogram_ms"


def _version(model: str, buckets: list[float], counts: list[int], total: float) -> VersionStatistics:
    return VersionStatistics(ModelStatistics(model, "1"), latency=Latency({}, buckets, counts, total))


def test_the_histogram_is_written_as_prometheus_cpp_writes_it():
    versions = {"m/1": _version("m", [-1.0, 0.0, 1.0, 2.5], [0, 2, 1, 0, 3], 6006.0)}
    text = render(versions, MetricsOptions(histogram_latencies=True)).decode()
    lines = [line for line in text.splitlines() if line.startswith(HISTOGRAM)]
    assert lines == [
        f'{HISTOGRAM}_count{{model="m",version="1"}} 6',
        f'{HISTOGRAM}_sum{{model="m",version="1"}} 6006',
        f'{HISTOGRAM}_bucket{{model="m",version="1",le="-1"}} 0',
        f'{HISTOGRAM}_bucket{{model="m",version="1",le="0"}} 2',
        f'{HISTOGRAM}_bucket{{model="m",version="1",le="1"}} 3',
        f'{HISTOGRAM}_bucket{{model="m",version="1",le="2.5"}} 3',
        f'{HISTOGRAM}_bucket{{model="m",version="1",le="+Inf"}} 6',
    ]
    family = next(f for f in text_string_to_metric_families(text) if f.name == HISTOGRAM)
    assert family.type == "histogram"


def test_the_histogram_is_there_only_when_asked_for_and_for_every_model():
    versions = {
        "a/1": _version("a", [100.0, 500.0, 2000.0, 5000.0], [0] * 5, 0.0),
        "b/1": _version("b", [1.0], [0, 0], 0.0),
    }
    assert HISTOGRAM not in render(versions).decode()  # counters only, by default
    text = render(versions, MetricsOptions(histogram_latencies=True)).decode()
    assert text.count(f"{HISTOGRAM}_count{{") == 2 and f'{HISTOGRAM}_sum{{model="b",version="1"}} 0' in text
    assert HISTOGRAM not in render({}, MetricsOptions(histogram_latencies=True)).decode()  # no model, no family


def test_doubles_have_sixteen_significant_digits():
    assert [double_text(v) for v in (2.5, 0.0, -1.0, 1e6, 1.611378656, float("inf"))] == [
        "2.5",
        "0",
        "-1",
        "1000000",
        "1.611378656",
        "+Inf",
    ]


def test_the_load_time_gauge_follows_the_pending_count_per_loaded_version():
    figures = ModelFigures(load_times=[LoadTime("a", 1, 1.611378656), LoadTime("a", 2, 0.004683712)])
    text = render({"a/1": _version("a", [], [0], 0.0)}, figures=figures).decode()
    assert '\nnv_model_load_duration_secs{model="a",version="1"} 1.611378656\n' in text
    assert '\nnv_model_load_duration_secs{model="a",version="2"} 0.004683712\n' in text
    assert (
        "# HELP nv_model_load_duration_secs Model load time in seconds\n# TYPE nv_model_load_duration_secs gauge"
        in text
    )
    assert text.index("nv_inference_pending_request_count") < text.index("nv_model_load_duration_secs")
    assert "nv_model_load_duration_secs" not in render({}, figures=ModelFigures()).decode()

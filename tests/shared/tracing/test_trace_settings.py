"""Triton's OpenTelemetry settings as tritonserver reads them, and W3C trace context."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.tracing import context
from shared.tracing.trace_settings import TraceConfigError, endpoint, mode, opentelemetry, split


def test_defaults_come_from_the_environment_as_tritonserver_reads_them():
    otel = opentelemetry([], {"OTEL_BSP_MAX_QUEUE_SIZE": "10", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "5"})
    assert (otel.bsp_max_queue_size, otel.bsp_schedule_delay, otel.bsp_max_export_batch_size) == (10, 5000, 5)
    assert otel.url == "http://localhost:4318/v1/traces" and otel.resource == ()
    with pytest.raises(TraceConfigError, match='Bad option: "OTEL_BSP_SCHEDULE_DELAY"'):
        opentelemetry([], {"OTEL_BSP_SCHEDULE_DELAY": "soon"})


def test_entries_keep_their_order_and_unknown_keys_are_kept():
    otel = opentelemetry(
        ["mode=opentelemetry", "opentelemetry,bsp_schedule_delay=7ms", "triton,file=x", "opentelemetry,foo=bar"], {}
    )
    # std::stoul reads the leading number; an unknown key is shown and used by nothing
    assert otel.bsp_schedule_delay == 7
    assert otel.entries == (
        ("bsp_schedule_delay", "7"),
        ("foo", "bar"),
        ("bsp_max_queue_size", "2048"),
        ("bsp_max_export_batch_size", "512"),
    )


def test_resources_repeat_and_split_at_the_first_equals():
    otel = opentelemetry(["opentelemetry,resource=a=b=c", "opentelemetry,resource=service.name=x"], {})
    assert otel.resource == (("a", "b=c"), ("service.name", "x"))


@pytest.mark.parametrize(
    "entry, text",
    [
        (",rate=1", "No trace mode specified"),
        ("jaeger,url=x", 'invalid value for trace mode option: jaeger. Available options are "triton"'),
        ("opentelemetry,url", "--trace-config option format is '<trace mode>,<setting>=<value>'"),
        ("opentelemetry,url=", "--trace-config option format is"),
        ("opentelemetry,bsp_max_queue_size=-1", "Provided option value is out of bound. Got -1"),
        ("opentelemetry,bsp_max_queue_size=x", 'Bad option: "--trace-config opentelemetry,bsp_max_queue_size"'),
    ],
)
def test_refused_entries(entry, text):
    with pytest.raises(TraceConfigError, match=text.replace("(", r"\(")):
        opentelemetry([entry], {})


def test_mode_and_split():
    assert mode([]) == "triton" and mode(["mode=OpenTelemetry"]) == "opentelemetry"
    assert split("opentelemetry,resource=k=v") == ("opentelemetry", "resource", "k=v")
    assert split("rate=5") == ("", "rate", "5")
    assert endpoint("localhost:4318/v1/traces") == "http://localhost:4318/v1/traces"
    assert endpoint("https://collector/v1/traces") == "https://collector/v1/traces"


@given(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.integers(0, 255))
def test_traceparent_round_trips(trace_id, span_id, flags):
    ref = context.SpanRef(trace_id, span_id, flags)
    assert context.parse(context.format(ref)) == ref


@pytest.mark.parametrize(
    "header",
    [
        "",
        "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424",  # no flags
        "00-00000000000000000000000000000000-b7ad6b7169242424-01",  # all-zero trace id
        "00-0af7651916cd43dd8448eb211c12666c-0000000000000000-01",  # all-zero span id
        "ff-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01",  # version ff
        "00-0AF7651916CD43DD8448EB211C12666C-b7ad6b7169242424-01",  # upper case
        "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01-extra",  # version 00 has 4 parts
    ],
)
def test_invalid_traceparent_is_ignored(header):
    assert context.parse(header) is None

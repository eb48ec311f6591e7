"""The trace extension's sampling and settings document (inference/trace.py), in both modes."""

from __future__ import annotations

from inference.trace import TracedTensor, Tracer, TraceSettings, tensor_json


def _tracer(**settings) -> Tracer:
    return Tracer(TraceSettings(**{"level": ("TIMESTAMPS",), "rate": 1, **settings}))


def test_opentelemetry_mode_traces_a_request_with_context_whatever_the_rate_and_count():
    tracer = _tracer(mode="opentelemetry", rate=0)  # rate 0: only requests that bring a context
    assert [tracer.sample("m") for _ in range(3)] == [False] * 3
    assert tracer.sample("m", forced=True)
    tracer = _tracer(mode="opentelemetry", rate=2, count=1)
    assert [tracer.sample("m") for _ in range(4)] == [False, True, False, False]  # count spent
    assert tracer.sample("m", forced=True)
    assert not _tracer(mode="opentelemetry", level=("OFF",)).sample("m", forced=True)


def test_triton_mode_needs_a_file():
    assert not _tracer().sample("m")
    assert _tracer(file="/tmp/t.json").sample("m")


def test_settings_document_per_mode():
    triton = TraceSettings(file="/t.json").json()
    assert list(triton) == ["trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode"]
    otel = TraceSettings(mode="opentelemetry", config=(("url", "u"), ("resource", "a=b"), ("resource", "c=d"))).json()
    assert list(otel) == ["trace_level", "trace_rate", "trace_count", "trace_mode", "url", "resource"]
    assert otel["trace_mode"] == "opentelemetry" and otel["resource"] == "a=b"


def test_tensor_entries_as_triton_writes_them():
    import numpy as np

    floats = TracedTensor("x", "FP32", [1, 3], np.array([0.1, 1.0, 2.5e10], np.float32).tobytes())
    assert tensor_json(floats) == {"name": "x", "data": "0.1,1,2.5e+10", "shape": "1,3", "dtype": "FP32"}
    words = TracedTensor("s", "BYTES", [2], b"\x02\x00\x00\x00hi\x01\x00\x00\x00!")
    assert tensor_json(words)["data"] == '"hi","!"'
    flags = TracedTensor("b", "BOOL", [2], bytes([0, 1]))
    assert tensor_json(flags)["data"] == "0,1"
    assert tensor_json(TracedTensor("r", "INT8", [1], None))["data"] == ""  # in shared memory

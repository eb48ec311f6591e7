"""OpenTelemetry tracing across services (`--trace-config mode=opentelemetry`; docs/serving.md, "Tracing").

`trace_settings.py` reads Triton's OpenTelemetry settings (pure); `context.py` reads and writes W3C
trace context (pure); `spans.py` is the process's span exporter, present only when tracing is on.
"""

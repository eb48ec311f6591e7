"""Metric rendering without a GPU: no GPU families, CPU gauges in range, exposition parses."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from services.gateway.gpu_metrics import GpuMetrics
from services.gateway.metrics import MetricsOptions, render
from services.gateway.system_metrics import CpuSampler


def test_render_without_gpu_has_no_gpu_families():
    gpu = GpuMetrics()
    text = render({}, MetricsOptions(), CpuSampler(), gpu).decode()
    families = {f.name for f in text_string_to_metric_families(text)}
    assert not gpu.available and not any(name.startswith("nv_gpu_") for name in families)
    assert {"nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"} <= families


def test_counter_latencies_can_be_switched_off():
    stats = {"m/1": {"stats": {"inference_count": 0, "execution_count": 0, "batch_stats": [], "inference_stats": {
        k: {"count": 0, "ns": 0} for k in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
    }}}}
    text = render(stats, MetricsOptions(counter_latencies=False)).decode()
    assert "nv_inference_request_duration_us" not in text and "nv_inference_count" in text

"""Metric rendering: GPU families exactly when NVML sees a GPU, CPU gauges in range, exposition parses."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.gateway.metrics.endpoint import MetricsOptions, render
from services.gateway.metrics.gpu import GpuMetrics
from services.gateway.metrics.system import CpuSampler
from services.worker.gpus import available_gpus
from shared.wire.statistics import ModelStatistics, VersionStatistics


@pytest.mark.skipif(bool(available_gpus()), reason="this host has a GPU: test_render_with_gpu_has_gpu_families")
def test_render_without_gpu_has_no_gpu_families():
    gpu = GpuMetrics()
    text = render({}, MetricsOptions(), CpuSampler(), gpu).decode()
    families = {f.name for f in text_string_to_metric_families(text)}
    assert not gpu.available and not any(name.startswith("nv_gpu_") for name in families)
    assert {"nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"} <= families


@pytest.mark.gpu
@pytest.mark.skipif(not available_gpus(), reason="needs a CUDA device and NVML (this host has none)")
def test_render_with_gpu_has_gpu_families():
    gpu = GpuMetrics()
    text = render({}, MetricsOptions(), CpuSampler(), gpu).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert gpu.available
    for name in ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes", "nv_gpu_power_usage"):
        assert [s.labels["gpu_uuid"][:4] for s in families[name].samples] == ["GPU-"] * len(families[name].samples)
    assert families["nv_gpu_memory_total_bytes"].samples[0].value > 0
    # --allow-gpu-metrics=false: none, even with a GPU
    off = render({}, MetricsOptions(gpu_metrics=False), CpuSampler(), gpu).decode()
    assert not any(f.name.startswith("nv_gpu_") for f in text_string_to_metric_families(off))


def test_counter_latencies_can_be_switched_off():
    stats = {"m/1": VersionStatistics(ModelStatistics("m", "1"))}
    text = render(stats, MetricsOptions(counter_latencies=False)).decode()
    assert "nv_inference_request_duration_us" not in text and "nv_inference_count" in text


def test_the_autoscaling_gauges_are_rendered_per_model():
    value = VersionStatistics(
        ModelStatistics("m", "1"), pending=5, oldest_wait_us=1_500_000, running_batches=3, busy_instances=1, instances=4
    )
    families = {f.name: f for f in text_string_to_metric_families(render({"m/1": value}).decode())}
    labels = {"model": "m", "version": "1"}
    for name, expected in (
        ("nv_inference_pending_request_count", 5),
        ("shoal_queue_oldest_wait_seconds", 1.5),
        ("shoal_inflight_batches", 3),
        ("shoal_instance_utilization", 0.25),
        ("shoal_model_instances", 4),
    ):
        assert families[name].type == "gauge"
        assert [(s.labels, s.value) for s in families[name].samples] == [(labels, expected)], name

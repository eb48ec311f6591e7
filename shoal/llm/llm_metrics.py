"""The example LLM's own metrics, through python_backend's custom metrics API
(`pb_utils.MetricFamily`), on `/metrics` after Triton's.

Named as Triton's LLM backends name them, so that dashboards and autoscalers made for those
read these unchanged: the vLLM backend's token counters and time-per-output-token histogram
(vllm_backend src/utils/metrics.py, its buckets too), the TensorRT-LLM backend's KV-cache gauge
(`nv_trt_llm_kv_cache_block_metrics`, a llama.cpp cell being a block of one token). Triton's
core has no inter-token or token metric: its time to first response is
`nv_inference_first_response_histogram_ms`, the scheduler's (docs/serving.md).

Counters and the histogram carry the model and version: the instances of a model add up, in one
process or over workers (the gateway sums equal labels). The KV gauge is one instance's context,
so it carries the instance too, and the worker's process (two workers may name their instances
alike, and equal labels would be summed).
"""

from __future__ import annotations

import os
import socket
from typing import Any

GENERATED = "vllm:generation_tokens_total"
PROMPT = "vllm:prompt_tokens_total"
TIME_PER_TOKEN = "vllm:time_per_output_token_seconds"
KV_CACHE = "nv_trt_llm_kv_cache_block_metrics"
# vllm_backend's, from vLLM's own
TIME_PER_TOKEN_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
KV_KINDS = ("max", "used", "free", "tokens_per", "fraction")


class LlmMetrics:
    """The engine's `Meter` (engine.py), kept in python_backend metrics."""

    def __init__(self, pb_utils: Any, labels: dict[str, str], instance: str) -> None:
        family = pb_utils.MetricFamily
        counter, gauge, histogram = family.COUNTER, family.GAUGE, family.HISTOGRAM
        self._prompt = family(PROMPT, "Number of prefill tokens processed.", counter).Metric(labels=labels)
        self._generated = family(GENERATED, "Number of generation tokens processed.", counter).Metric(labels=labels)
        per_token = family(TIME_PER_TOKEN, "Histogram of time per output token in seconds.", histogram)
        self._per_token = per_token.Metric(labels=labels, buckets=TIME_PER_TOKEN_BUCKETS)
        kv = family(KV_CACHE, "TRT LLM KV cache block metrics", gauge)
        where = {**labels, "instance": instance, "process": f"{socket.gethostname()}:{os.getpid()}"}
        self._kv = {kind: kv.Metric(labels={**where, "kv_cache_block_type": kind}) for kind in KV_KINDS}
        self._kv["tokens_per"].set(1)  # llama.cpp's cache holds one token per cell
        self._last_cells = (-1, -1)

    def prompt(self, tokens: int) -> None:
        self._prompt.increment(tokens)

    def token(self, gap_s: float | None) -> None:
        self._generated.increment(1)
        if gap_s is not None:  # a sequence's first token has no time per token: its prefill's
            self._per_token.observe(gap_s)

    def cells(self, used: int, total: int) -> None:
        if (used, total) == self._last_cells:  # every step reports; the gauges change far less often
            return
        self._last_cells = (used, total)
        for kind, value in (("max", total), ("used", used), ("free", total - used)):
            self._kv[kind].set(value)
        self._kv["fraction"].set(used / total if total else 0.0)

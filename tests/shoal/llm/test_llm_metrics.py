"""The example LLM's metrics (shoal/llm/llm_metrics.py): what the engine tells its meter, on the
counting model of test_engine.py, and how it lands in python_backend's custom metrics."""

from __future__ import annotations

import pytest

from services.worker.python.triton_api import custom_metrics, pb_utils
from shoal.llm import llm_metrics
from shoal.llm.engine import Engine, Limits
from shoal.llm.llm_metrics import LlmMetrics
from tests.shoal.llm.test_engine import CountingModel, run


class Recorder:
    def __init__(self) -> None:
        self.prompts: list[int] = []
        self.gaps: list[float | None] = []
        self.seen: list[tuple[int, int]] = []

    def prompt(self, tokens: int) -> None:
        self.prompts.append(tokens)

    def token(self, gap_s: float | None) -> None:
        self.gaps.append(gap_s)

    def cells(self, used: int, total: int) -> None:
        self.seen.append((used, total))


def test_the_engine_meters_prompts_tokens_their_gaps_and_cells():
    meter, model = Recorder(), CountingModel(n_ctx=256, step_delay=0.002)
    engine = Engine(model, Limits(prefix_cache_tokens=0, max_sequences=4, max_sequence_tokens=64), meter)
    try:
        sink = run(engine, [1, 2, 3], max_tokens=5)
        assert sink.done.wait(10)
    finally:
        engine.close()
    assert meter.prompts == [3]
    assert meter.gaps[0] is None and len(meter.gaps) == 5  # the first token has no gap: its prefill's
    assert all(gap is not None and 0.002 <= gap < 1 for gap in meter.gaps[1:])
    assert (3 + 5, 256) in meter.seen  # reserved: the prompt and the most it may generate
    assert meter.seen[-1] == (0, 256)  # all given back once it ended


@pytest.fixture
def fresh_families(monkeypatch):
    monkeypatch.setattr(custom_metrics, "_families", {})


def _samples(name: str) -> dict[tuple, custom_metrics.MetricSample]:
    family = next(f for f in custom_metrics.metrics_snapshot() if f.name == name)
    return {tuple(sorted(s.labels.items())): s for s in family.samples}


def test_metrics_as_triton_llm_backends_name_them(fresh_families):
    labels = {"model": "llm", "version": "1"}
    one, two = LlmMetrics(pb_utils, labels, "llm_0"), LlmMetrics(pb_utils, labels, "llm_1")
    one.prompt(7)
    two.prompt(3)
    for meter in (one, two):
        meter.token(None)
        meter.token(0.03)
    one.cells(30, 120)
    [generated] = _samples(llm_metrics.GENERATED).values()
    [prompt] = _samples(llm_metrics.PROMPT).values()
    [per_token] = _samples(llm_metrics.TIME_PER_TOKEN).values()
    assert (generated.value, prompt.value) == (4, 10)  # two instances, one series: they add up
    assert sum(per_token.counts) == 2 and per_token.sum == pytest.approx(0.06)
    assert per_token.buckets == llm_metrics.TIME_PER_TOKEN_BUCKETS
    kv = {
        (s.labels["instance"], s.labels["kv_cache_block_type"]): s.value
        for s in _samples(llm_metrics.KV_CACHE).values()
    }
    assert kv[("llm_0", "used")] == 30 and kv[("llm_0", "free")] == 90 and kv[("llm_0", "max")] == 120
    assert kv[("llm_0", "fraction")] == 0.25 and kv[("llm_0", "tokens_per")] == 1
    assert kv[("llm_1", "max")] == 0  # no step yet

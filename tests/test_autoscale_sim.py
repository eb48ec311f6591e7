"""benchmarks/autoscale_sim.py: the queue model and each policy's published rules (pure logic, seconds)."""

from __future__ import annotations

import math
import types
from dataclasses import dataclass, replace
from typing import Any

from benchmarks.autoscale_sim import (
    Config,
    KnativeKPA,
    RayServeDefault,
    ShoalModel,
    ShoalModule,
    Signals,
    fixed,
    simulate,
    trace,
)


def signals(**given: Any) -> Signals:
    base = Signals(
        now=0, pending=0, oldest_wait_s=0, busy_instances=0, instances=40, in_system=0, requests=0, ready=10, starting=0
    )
    return replace(base, **given)


def test_the_trace_peaks_where_asked_and_a_peak_fleet_never_queues() -> None:
    cfg = Config(hours=2, peak_rate=8_000, max_workers=100)
    rates = trace(cfg)
    assert len(rates) == 7200 and math.isclose(rates.max(), 8_000)
    result = simulate(cfg, rates, "fixed", fixed(100), 3600, 100)
    assert result.worker_hours == 200 and result.max_wait_s < 0.05  # M/M/c waits of 400 instances at <= 80 %
    assert abs(result.requests - rates.sum()) < 0.01 * rates.sum()  # every request answered once


def test_too_few_workers_build_a_backlog_whose_waits_are_counted() -> None:
    cfg = Config(hours=0.5, peak_rate=8_000, max_workers=100, bursts=0)
    result = simulate(cfg, trace(cfg), "half", fixed(50), 3600, 50)  # 5,000/s of capacity for up to 8,000
    assert result.p99_ms > 60_000 and result.hours_over_target == 0  # half an hour: no whole hour counted


def test_a_cold_start_delays_the_capacity_asked_for() -> None:
    cfg = Config(hours=0.25, peak_rate=8_000, max_workers=100, bursts=0, cold_start_s=120)
    rates = trace(cfg) * 0 + 8_000
    result = simulate(cfg, rates, "late", fixed(100), 3600, 10)  # asks 100 at once, has 10 for 120 s
    assert 100 < result.max_wait_s < 130


def test_ray_waits_upscale_delay_before_scaling_up_and_downscale_delay_before_down() -> None:
    ray = RayServeDefault()
    busy = signals(in_system=80)  # 8 per replica, target 2: 40 wanted
    decisions = [ray(replace(busy, now=t), 10, float(t)) for t in range(0, 40)]
    first = decisions.index(40)
    assert 30 <= first <= 32 and set(decisions[:first]) == {10}
    ray = RayServeDefault()
    idle = signals(in_system=4)
    decisions = [ray(replace(idle, now=t), 10, float(t)) for t in range(0, 610)]
    first = decisions.index(2)
    assert 600 <= first <= 602 and set(decisions[:first]) == {10}


def test_knative_halves_at_most_per_tick_and_panics_on_a_burst() -> None:
    kpa = KnativeKPA(target=4.0)
    assert kpa(signals(in_system=0), 10, 0.0) == 5  # wants 1, may go down to 10 / 2
    kpa = KnativeKPA(target=4.0)
    kpa(signals(in_system=40), 10, 0.0)
    assert kpa(signals(in_system=400), 10, 2.0) >= 20 and kpa.panic_since is not None
    assert kpa(signals(in_system=0), 10, 4.0) >= 10  # no scale-down in panic


def test_the_modelled_shoal_policy_scales_on_queue_time_and_cools_down() -> None:
    shoal = ShoalModel(max_replicas=100)
    assert shoal(signals(oldest_wait_s=0.5), 10, 0.0) == 20  # 5x the target: at most doubling
    assert shoal(signals(oldest_wait_s=0.5), 20, 5.0) == 20  # up cool-down
    quiet = signals(busy_instances=4, instances=80)
    assert shoal(quiet, 20, 20.0) == 20 and shoal(quiet, 20, 79.0) == 20
    assert shoal(quiet, 20, 81.0) == 18  # slack held 60 s: at most 10 % fewer


def test_the_adapter_passes_signals_and_state_to_a_policy_module() -> None:
    @dataclass(frozen=True)
    class State:
        calls: int = 0

    @dataclass(frozen=True)
    class Decision:
        replicas: int
        state: State

    seen = []

    def decide(policy: Any, sig: Any, replicas: int, now: float, state: State) -> Decision:
        seen.append((sig.pending, sig.oldest_wait_s, sig.busy_instances, sig.instances, state.calls))
        return Decision(replicas + 1, State(state.calls + 1))

    module = types.SimpleNamespace(
        Policy=lambda **kw: kw, Signals=lambda **kw: types.SimpleNamespace(**kw), State=State, decide=decide
    )
    adapter = ShoalModule(module, max_replicas=5)
    assert adapter(signals(pending=3.4, oldest_wait_s=0.2, busy_instances=7.6), 4, 1.0) == 5
    assert adapter(signals(), 5, 3.0) == 6
    assert seen == [(3, 0.2, 8, 40, 0), (0, 0, 0, 40, 1)]

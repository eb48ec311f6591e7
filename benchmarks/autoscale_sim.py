#!/usr/bin/env python3
"""Autoscaling at scale, on paper (issue 45, item 5): a time-stepped simulation of a fleet of up to
1,000 workers under a day of diurnal load with bursts, where a worker added serves only after its
cold start (the pod's start and the model's load). For each policy: the p50/p99/p99.9 queue time of
every request and the worker-hours spent (a worker counts from the moment it is asked for, cold
start included, until it is removed).

usage: python benchmarks/autoscale_sim.py [--hours 24] [--cold-start-s 60] [--seed 1] [--p99-target-ms 250]
                                          [--shoal-policy PATH] [--json FILE]

Policies, each a plain callable `(signals, replicas, now) -> desired replicas`, called every
`interval_s` seconds of simulated time:
  fixed      the fleet sized for the peak: 1,000 workers all day;
  shoal      Shoal's policy: the pure module `shoal/autoscale/policy.py` (branch `autoscale`) through a
             small adapter when it can be imported (or loaded from --shoal-policy PATH); else a model
             of the policy as issue 45 describes it (scale on queue time against a target, cool-downs,
             scale to zero after an idle window), written here only;
  ray        Ray Serve's default autoscaling policy (replica_queue_length_autoscaling_policy) with its
             documented defaults (ray.serve.config.AutoscalingConfig): target_ongoing_requests 2,
             metrics_interval_s 10, look_back_period_s 30, smoothing_factor 1, upscale_delay_s 30,
             downscale_delay_s 600; max_replicas (default 1) set to 1,000, min_replicas 1;
  kpa        KServe's default, Knative's Pod Autoscaler (config-autoscaler defaults): concurrency
             target 100 x 70 % utilisation = 70 per pod, stable window 60 s, panic window 10 % (6 s),
             panic threshold 200 %, max scale-up rate 1000, max scale-down rate 2, tick 2 s;
             KServe's default minReplicas 1.

The model (docs/autoscale-simulation.md says what it leaves out): one model, one pooled queue (the
schedulers dispatch any request to any free instance), each worker `--slots` instances of
`--service-ms` each (default 4 x 40 ms: 100 requests/s per worker, 100,000/s for 1,000). Each second,
arrivals are Poisson at the trace's rate; the ready workers' capacity serves the backlog first
(FIFO, each cohort's wait exact to the second's fraction) then the second's arrivals, whose wait
below saturation is M/M/c's (Erlang C by the Halfin-Whitt approximation, exponential tail); what
exceeds capacity joins the backlog. Every request's wait goes into a log-binned histogram (0.1 ms to
3 h), from which the percentiles come.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

DAY_S = 86_400


@dataclass(frozen=True)
class Signals:
    """What an autoscaler may read at `now` (each policy reads what its real counterpart reads)."""

    now: float
    pending: float  # requests waiting, not started (backlog + the M/M/c queue's mean length)
    oldest_wait_s: float  # the oldest waiting request's age (Shoal's shoal_queue_oldest_wait_seconds)
    busy_instances: float  # instances holding a request
    instances: int  # instances of the ready workers
    in_system: float  # busy + pending: Ray's ongoing requests, Knative's concurrency
    requests: int  # requests answered so far (a counter)
    ready: int  # workers serving
    starting: int  # workers asked for, still in their cold start


Policy = Callable[[Signals, int, float], int]


@dataclass
class Config:
    hours: float = 24.0
    dt: float = 1.0
    slots: int = 4
    service_s: float = 0.040
    cold_start_s: float = 60.0
    max_workers: int = 1000
    peak_rate: float = 85_000.0  # the trace's highest second: 85 % of 1,000 workers' capacity
    trough_share: float = 0.18  # the night's rate / the day's (bursts aside)
    bursts: int = 10
    seed: int = 1
    p99_target_s: float = 0.25

    @property
    def worker_rate(self) -> float:
        return self.slots / self.service_s


# -- the load -----------------------------------------------------------------------------------
def trace(cfg: Config) -> np.ndarray:
    """Requests/s for each second: a raised-cosine day (lowest at 04:00, highest at 16:00), a few
    percent of slow noise, and bursts (+20..60 % of the moment's load within 20 s, held 2..12 min,
    gone over a minute), scaled so that the busiest second is `peak_rate`."""
    rng = np.random.default_rng(cfg.seed)
    n = int(cfg.hours * 3600 / cfg.dt)
    t = np.arange(n) * cfg.dt
    day = 0.5 - 0.5 * np.cos(2 * np.pi * (t - 4 * 3600) / DAY_S)  # 0 at 04:00, 1 at 16:00
    base = cfg.trough_share + (1 - cfg.trough_share) * day
    wander = np.interp(t, np.arange(0, t[-1] + 600, 600), 1 + 0.04 * rng.standard_normal(int(t[-1] // 600) + 2))
    rate = base * wander
    for _ in range(cfg.bursts):
        start = rng.uniform(0, t[-1] - 900)
        hold = rng.uniform(120, 720)
        size = rng.uniform(0.2, 0.6)
        rise = np.clip((t - start) / 20, 0, 1)
        fall = np.clip(1 - (t - start - hold) / 60, 0, 1)
        rate = rate * (1 + size * np.minimum(rise, fall))
    return rate * (cfg.peak_rate / rate.max())


# -- the queue ----------------------------------------------------------------------------------
EDGES = np.concatenate(([0.0], np.logspace(-4, math.log10(3 * 3600), 241)))


def erlang_c(servers: float, rho: float) -> float:
    """P(wait > 0) in M/M/c, Halfin-Whitt's approximation (good for the thousands of servers here)."""
    if rho >= 1:
        return 1.0
    beta = (1 - rho) * math.sqrt(servers)
    if beta > 8:
        return 0.0
    phi = math.exp(-beta * beta / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + math.erf(beta / math.sqrt(2)))
    return 1 / (1 + beta * cdf / phi)


@dataclass
class Result:
    policy: str
    worker_hours: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    max_wait_s: float
    peak_workers: int
    mean_workers: float
    requests: int
    hours_over_target: int  # hours of the day whose own p99 exceeded the target
    changes: int  # scaling decisions that changed the count
    timeline: list[tuple[float, float, int]] = field(default_factory=list)  # (hour, rate, workers), hourly

    def row(self, fixed_hours: float) -> str:
        saving = 1 - self.worker_hours / fixed_hours

        def ms(value: float) -> str:  # the first bin: no wait worth the name
            return "<0.1" if value <= EDGES[1] * 1000 else f"{value:,.1f}"

        return (
            f"| {self.policy} | {self.worker_hours:,.0f} | {saving:.1%} | {ms(self.p50_ms)} | {ms(self.p99_ms)} | "
            f"{ms(self.p999_ms)} | {self.max_wait_s:.1f} | {self.hours_over_target} | {self.mean_workers:.0f} | "
            f"{self.peak_workers} | {self.changes} |"
        )


def percentile(hist: np.ndarray, q: float) -> float:
    cumulative = np.cumsum(hist)
    if cumulative[-1] <= 0:
        return 0.0
    i = int(np.searchsorted(cumulative, q * cumulative[-1]))
    i = min(i, len(EDGES) - 2)
    return float(EDGES[i + 1])  # the bin's upper edge: never flattering


def simulate(cfg: Config, rates: np.ndarray, name: str, policy: Policy, interval_s: float, start: int) -> Result:
    rng = np.random.default_rng(cfg.seed + 1)
    dt, mu = cfg.dt, 1 / cfg.service_s
    hist = np.zeros(len(EDGES) - 1)
    hour_hist = np.zeros(len(EDGES) - 1)
    hours_over = 0
    backlog: deque[list[float]] = deque()  # [arrival time, count], oldest first
    backlog_n = 0.0
    ready = start
    starting: deque[float] = deque()  # when each starting worker becomes ready
    worker_seconds = 0.0
    answered = 0.0
    peak = start
    changes = 0
    next_decision = 0.0
    signals = Signals(0, 0, 0, 0, ready * cfg.slots, 0, 0, ready, 0)
    timeline: list[tuple[float, float, int]] = []
    total_workers = 0.0
    for step, rate in enumerate(rates):
        now = step * dt
        while starting and starting[0] <= now:
            starting.popleft()
            ready += 1
        replicas = ready + len(starting)
        if now >= next_decision:
            desired = max(0, min(cfg.max_workers, int(policy(signals, replicas, now))))
            if desired != replicas:
                changes += 1
            while replicas < desired:
                starting.append(now + cfg.cold_start_s)
                replicas += 1
            while replicas > desired:  # the newest starting first, then ready ones
                if starting:
                    starting.pop()
                else:
                    ready -= 1
                replicas -= 1
            next_decision = now + interval_s
        peak = max(peak, replicas)
        worker_seconds += replicas * dt
        total_workers += replicas
        arrivals = float(rng.poisson(rate * dt))
        capacity = ready * cfg.slots * mu * dt
        served = 0.0
        while backlog and served < capacity:  # the backlog first, oldest first
            cohort = backlog[0]
            take = min(cohort[1], capacity - served)
            at = now + dt * (served + take / 2) / max(capacity, 1e-9)
            hist[np.searchsorted(EDGES, at - cohort[0], side="right") - 1] += take
            hour_hist[np.searchsorted(EDGES, at - cohort[0], side="right") - 1] += take
            served += take
            cohort[1] -= take
            backlog_n -= take
            if cohort[1] <= 1e-9:
                backlog.popleft()
        room = capacity - served
        now_served = min(arrivals, room)
        queue_mean = tail = 0.0
        if now_served > 0:
            # steady-state M/M/c within one second: only well below saturation (at 0.98 and more, the
            # second's queue is not in its steady state and the fluid backlog carries the excess)
            rho = min(0.98, (served + now_served) / capacity)
            servers = ready * cfg.slots
            waits = erlang_c(servers, rho)
            if waits > 0:
                theta = servers * mu * (1 - rho)
                tail = math.log(waits / 1e-3) / theta if waits > 1e-3 else 0.0  # its 99.9th percentile
                cdf = 1 - waits * np.exp(-theta * EDGES)
                share = np.diff(cdf)
                share[0] += 1 - waits  # no wait at all
                hist += now_served * share
                hour_hist += now_served * share
                queue_mean = min(now_served, waits * rho / (1 - rho))
            else:
                hist[0] += now_served
                hour_hist[0] += now_served
        if arrivals > now_served:
            backlog.append([now + dt / 2, arrivals - now_served])
            backlog_n += arrivals - now_served
        answered += served + now_served
        busy = (served + now_served) / dt * cfg.service_s
        # the oldest waiting: the backlog's first cohort, else the M/M/c wait's 99.9th percentile
        oldest = now + dt - backlog[0][0] if backlog else tail
        pending = backlog_n + queue_mean
        signals = Signals(
            now + dt, pending, oldest, busy, ready * cfg.slots, busy + pending, int(answered), ready, len(starting)
        )
        if (step + 1) * dt % 3600 == 0:
            if percentile(hour_hist, 0.99) > cfg.p99_target_s:
                hours_over += 1
            timeline.append(((step + 1) * dt / 3600, float(rate), replicas))
            hour_hist[:] = 0
    return Result(
        name,
        worker_seconds / 3600,
        percentile(hist, 0.5) * 1000,
        percentile(hist, 0.99) * 1000,
        percentile(hist, 0.999) * 1000,
        percentile(hist, 1.0),
        peak,
        total_workers / len(rates),
        int(answered),
        hours_over,
        changes,
        timeline,
    )


# -- the policies -------------------------------------------------------------------------------
def fixed(count: int) -> Policy:
    return lambda signals, replicas, now: count


class ShoalModule:
    """Adapter to shoal/autoscale/policy.py's `decide(policy, signals, replicas, now, state)`."""

    def __init__(self, module: Any, **params: Any) -> None:
        self.module = module
        self.policy = module.Policy(**params)
        self.state = module.State()
        self.params = params

    def __call__(self, signals: Signals, replicas: int, now: float) -> int:
        seen = self.module.Signals(
            pending=int(round(signals.pending)),
            oldest_wait_s=signals.oldest_wait_s,
            busy_instances=int(round(signals.busy_instances)),
            instances=signals.instances,
            requests=signals.requests,
            loads=0,
        )
        decision = self.module.decide(self.policy, seen, replicas, now, self.state)
        self.state = decision.state
        return int(decision.replicas)


class ShoalModel:
    """Shoal's policy as issue 45 describes it, modelled here only (used when the module is absent):
    the oldest wait over its target scales up by that ratio (at most doubling) after an up cool-down;
    slack (short waits, busy instances under the utilisation target in fewer workers) held for the
    down cool-down shrinks to what the busy instances need at that target, at most 10 % a step;
    min 0 and no request for the idle window: to zero."""

    def __init__(
        self,
        min_replicas: int = 1,
        max_replicas: int = 1000,
        target_queue_s: float = 0.1,
        target_utilization: float = 0.6,
        scale_up_cooldown_s: float = 10.0,
        scale_down_cooldown_s: float = 60.0,
        idle_window_s: float = 300.0,
    ) -> None:
        self.p = dict(locals())
        del self.p["self"]
        self.last_change = -math.inf
        self.slack_since: float | None = None
        self.last_active = -math.inf
        self.requests = -1

    def __call__(self, signals: Signals, replicas: int, now: float) -> int:
        p = self.p
        if signals.pending > 0 or signals.requests != self.requests:
            self.last_active = now
        self.requests = signals.requests

        def to(count: int) -> int:
            if count != replicas:
                self.last_change = now
            return count

        if replicas == 0:
            return to(max(1, p["min_replicas"])) if signals.pending > 0 else 0
        ratio = signals.oldest_wait_s / p["target_queue_s"]
        if ratio > 1:
            self.slack_since = None
            if now - self.last_change < p["scale_up_cooldown_s"]:
                return replicas
            return to(min(p["max_replicas"], max(replicas + 1, math.ceil(replicas * min(ratio, 2.0)))))
        cooled = now - self.last_change >= p["scale_down_cooldown_s"]
        if p["min_replicas"] == 0 and now - self.last_active >= p["idle_window_s"] and cooled:
            return to(0)
        needed = math.ceil(signals.busy_instances / (p["target_utilization"] * (signals.instances / max(replicas, 1))))
        if ratio <= 0.5 and needed < replicas:
            self.slack_since = now if self.slack_since is None else self.slack_since
            if cooled and now - self.slack_since >= p["scale_down_cooldown_s"]:
                self.slack_since = None
                return to(max(p["min_replicas"], 1, needed, math.floor(replicas * 0.9)))
            return replicas
        self.slack_since = None
        return replicas


class RayServeDefault:
    """Ray Serve's replica_queue_length_autoscaling_policy with AutoscalingConfig's defaults:
    the ongoing requests (running and queued) per running replica, averaged over look_back_period_s
    of reports every metrics_interval_s, against target_ongoing_requests; smoothing_factor 1; the
    decision held upscale_delay_s (up) or downscale_delay_s (down) before it is applied."""

    def __init__(
        self,
        target_ongoing_requests: float = 2.0,
        metrics_interval_s: float = 10.0,
        look_back_period_s: float = 30.0,
        smoothing_factor: float = 1.0,
        upscale_delay_s: float = 30.0,
        downscale_delay_s: float = 600.0,
        min_replicas: int = 1,
        max_replicas: int = 1000,
        interval_s: float = 1.0,
    ) -> None:
        self.p = dict(locals())
        del self.p["self"]
        self.samples: deque[tuple[float, float]] = deque()
        self.next_sample = 0.0
        self.counter = 0

    def __call__(self, signals: Signals, replicas: int, now: float) -> int:
        p = self.p
        if now >= self.next_sample:  # the replicas' and handles' reports
            self.samples.append((now, signals.in_system))
            self.next_sample = now + p["metrics_interval_s"]
        while self.samples and self.samples[0][0] < now - p["look_back_period_s"]:
            self.samples.popleft()
        running = max(signals.ready, 1)
        ongoing = sum(v for _, v in self.samples) / max(len(self.samples), 1)
        error = (ongoing / running) / p["target_ongoing_requests"]
        smoothed = 1 + (error - 1) * p["smoothing_factor"]
        desired = min(p["max_replicas"], max(p["min_replicas"], math.ceil(running * smoothed)))
        if desired > replicas:
            self.counter = max(self.counter, 0) + 1
            if self.counter * p["interval_s"] > p["upscale_delay_s"]:
                self.counter = 0
                return desired
        elif desired < replicas:
            self.counter = min(self.counter, 0) - 1
            if -self.counter * p["interval_s"] > p["downscale_delay_s"]:
                self.counter = 0
                return desired
        else:
            self.counter = 0
        return replicas


class KnativeKPA:
    """Knative's Pod Autoscaler with config-autoscaler's defaults (KServe's default autoscaler):
    concurrency averaged over the stable (60 s) and panic (6 s) windows against 100 x 70 % per pod;
    panic when the panic window wants 2x the ready pods, no scale-down while in panic, out of panic
    after a stable window without the condition; scale-up at most 1000x, scale-down at most /2 a tick."""

    def __init__(
        self,
        target: float = 100 * 0.70,
        stable_window_s: float = 60.0,
        panic_window_share: float = 0.10,
        panic_threshold: float = 2.0,
        max_scale_up_rate: float = 1000.0,
        max_scale_down_rate: float = 2.0,
        min_replicas: int = 1,
        max_replicas: int = 1000,
    ) -> None:
        self.p = dict(locals())
        del self.p["self"]
        self.samples: deque[tuple[float, float]] = deque()
        self.panic_since: float | None = None
        self.max_panic = 0

    def _average(self, now: float, window: float) -> float:
        values = [v for t, v in self.samples if t > now - window]
        return sum(values) / max(len(values), 1)

    def __call__(self, signals: Signals, replicas: int, now: float) -> int:
        p = self.p
        self.samples.append((now, signals.in_system))
        while self.samples and self.samples[0][0] <= now - p["stable_window_s"]:
            self.samples.popleft()
        ready = max(signals.ready, 1)
        up, down = math.ceil(p["max_scale_up_rate"] * ready), math.floor(ready / p["max_scale_down_rate"])
        stable = min(up, max(down, math.ceil(self._average(now, p["stable_window_s"]) / p["target"])))
        panic_window = p["stable_window_s"] * p["panic_window_share"]
        panic = min(up, max(down, math.ceil(self._average(now, panic_window) / p["target"])))
        if panic / ready >= p["panic_threshold"]:
            if self.panic_since is None:
                self.panic_since = now
                self.max_panic = 0
            self.panic_since = now  # extended while the condition holds
        elif self.panic_since is not None and now - self.panic_since >= p["stable_window_s"]:
            self.panic_since = None
        if self.panic_since is not None:
            self.max_panic = max(self.max_panic, panic, replicas)
            desired = self.max_panic
        else:
            desired = stable
        return min(p["max_replicas"], max(p["min_replicas"], desired))


def load_shoal_policy(path: str) -> Any:
    """shoal.autoscale.policy: from --shoal-policy PATH, else importable, else None."""
    if path:
        spec = importlib.util.spec_from_file_location("shoal_autoscale_policy", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses resolve their module by name
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module("shoal.autoscale.policy")  # once branch autoscale is merged
    except ImportError:
        return None


def policies(cfg: Config, module: Any) -> list[tuple[str, Policy, float, int]]:
    """(name, policy, decision interval, workers at the start) for each policy compared."""
    start = math.ceil(trace_start_rate(cfg) / (cfg.worker_rate * 0.6))
    chosen: list[tuple[str, Policy, float, int]] = [
        ("fixed, sized for the peak", fixed(cfg.max_workers), 3600, cfg.max_workers)
    ]
    if module is not None:
        defaults = dict(min_replicas=1, max_replicas=cfg.max_workers, target_queue_s=0.1)
        chosen.append(("Shoal (shoal/autoscale/policy.py, its defaults)", ShoalModule(module, **defaults), 2.0, start))
        fleet = dict(defaults, scale_down_cooldown_s=10.0)
        chosen.append(("Shoal (policy.py, down cool-down 10 s)", ShoalModule(module, **fleet), 2.0, start))
    chosen.append(("Shoal (modelled here, issue 45's rules)", ShoalModel(max_replicas=cfg.max_workers), 2.0, start))
    chosen.append(("Ray Serve default", RayServeDefault(max_replicas=cfg.max_workers), 1.0, start))
    chosen.append(("KServe default (Knative KPA)", KnativeKPA(max_replicas=cfg.max_workers), 2.0, start))
    # not a default: KServe's scaleTarget set to what a worker runs at once (its instances)
    tuned = KnativeKPA(target=float(cfg.slots), max_replicas=cfg.max_workers)
    chosen.append((f"KServe, scaleTarget {cfg.slots} (tuned)", tuned, 2.0, start))
    return chosen


_START_RATE: dict[tuple[float, int], float] = {}


def trace_start_rate(cfg: Config) -> float:
    return _START_RATE.get((cfg.peak_rate, cfg.seed), cfg.peak_rate * cfg.trough_share)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--cold-start-s", type=float, default=60.0, help="a new worker's start and model load")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--p99-target-ms", type=float, default=250.0)
    parser.add_argument("--shoal-policy", default="", help="path of shoal/autoscale/policy.py (branch autoscale)")
    parser.add_argument("--json", default="", help="write the results here too")
    args = parser.parse_args(argv)
    cfg = Config(
        hours=args.hours, cold_start_s=args.cold_start_s, seed=args.seed, p99_target_s=args.p99_target_ms / 1000
    )
    rates = trace(cfg)
    _START_RATE[(cfg.peak_rate, cfg.seed)] = float(rates[0])
    module = load_shoal_policy(args.shoal_policy)
    print(
        f"trace: {args.hours:g} h, {rates.mean():,.0f} req/s mean, {rates.min():,.0f} min, {rates.max():,.0f} max; "
        f"{cfg.max_workers} workers x {cfg.worker_rate:.0f} req/s; cold start {cfg.cold_start_s:g} s; "
        f"Shoal's policy: {'shoal/autoscale/policy.py' if module is not None else 'not importable: modelled here'}",
        file=sys.stderr,
    )
    results = []
    for name, policy, interval, start in policies(cfg, module):
        results.append(simulate(cfg, rates, name, policy, interval, start))
        print(f"  {name}: done", file=sys.stderr)
    fixed_hours = results[0].worker_hours
    print(
        f"\np99 target {args.p99_target_ms:g} ms; cold start {cfg.cold_start_s:g} s; seed {cfg.seed}\n\n"
        "| policy | worker-hours | vs fixed | p50 ms | p99 ms | p99.9 ms | max wait s | hours p99 > target | "
        "mean workers | peak workers | changes |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for result in results:
        print(result.row(fixed_hours))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"config": asdict(cfg), "results": [asdict(r) for r in results]}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

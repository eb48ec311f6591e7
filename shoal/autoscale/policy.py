"""How many workers a Shoal deployment wants, from its queues: the autoscaling policy, a pure function.

`decide(policy, signals, replicas, now, state)` returns the desired worker count and the state
to pass next time (the cool-downs' clocks). Nothing here reads a clock, the bus or Docker: `shoal
autoscale` (shoal/autoscale/controller.py) feeds it what it read and applies what it says, and a
simulation can call it with made-up signals and times (docs/scaling.md, "The policy").

The rules, in order:

1. Outside `[min_replicas, max_replicas]`: back inside at once.
2. At zero: a request waiting (queued, or for an on-demand load) starts `max(1, min)` workers at
   once; the request waits for one (the model loads on demand, within its deadline).
3. Pressure (the oldest request not started has waited longer than `target_queue_s`, or more
   than `target_pending` requests wait per worker): scale up by the ratio of the worst signal to
   its target, at least one worker and at most doubling, once `scale_up_cooldown_s` has passed since
   the last change.
4. Slack (nothing waits longer than half the target, and the busy instances would fit in one
   worker fewer at `target_utilization`) held for `scale_down_cooldown_s`, and as long since the
   last change: one worker fewer.
5. `min_replicas` 0 and no request seen for `idle_window_s`: to zero (after the down cool-down too).
   The window counts from the first call at the earliest: what came before it is not known.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Policy:
    min_replicas: int = 1
    max_replicas: int = 8
    target_queue_s: float = 0.1  # the longest a request should wait before it starts
    target_pending: float = 0.0  # requests waiting per worker (0: this signal is off)
    target_utilization: float = 0.6  # busy instances / instances a worker fewer must stay under
    scale_up_cooldown_s: float = 10.0
    scale_down_cooldown_s: float = 60.0
    idle_window_s: float = 300.0  # min_replicas 0: no request for this long scales to zero

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError(f"need 0 <= min ({self.min_replicas}) <= max ({self.max_replicas}), max >= 1")
        if self.target_queue_s <= 0 or not 0 < self.target_utilization <= 1 or self.target_pending < 0:
            raise ValueError("target_queue_s > 0, 0 < target_utilization <= 1 and target_pending >= 0")


@dataclass(frozen=True)
class Signals:
    """What the schedulers say now, summed over the models and scheduler replicas (see docs/scaling.md
    for the metrics and status fields they come from)."""

    pending: int = 0  # requests not started yet
    oldest_wait_s: float = 0.0  # the longest any of them has waited
    busy_instances: int = 0  # instances holding a batch
    instances: int = 0  # instances known
    requests: int = 0  # requests answered so far (a counter: activity is its change)
    loads: int = 0  # on-demand loads requests wait for (at zero workers, what shows a request came)


@dataclass(frozen=True)
class State:
    """The policy's memory between two calls; `State()` before the first."""

    last_change: float = -math.inf  # when the desired count last changed
    last_active: float = -math.inf  # when a request was last seen waiting or answered
    slack_since: float | None = None  # since when slack (rule 4) has held
    requests: int = -1  # `Signals.requests` at the last call (-1: none yet)


@dataclass(frozen=True)
class Decision:
    replicas: int
    state: State
    reason: str


def pressure(policy: Policy, signals: Signals, replicas: int) -> float:
    """The worst signal over its target (> 1: more workers wanted)."""
    ratio = signals.oldest_wait_s / policy.target_queue_s
    if policy.target_pending > 0:
        ratio = max(ratio, signals.pending / (policy.target_pending * max(replicas, 1)))
    return ratio


def slack(policy: Policy, signals: Signals, replicas: int) -> bool:
    """One worker fewer would do: nothing waits long and the busy instances fit in the rest."""
    if replicas <= 0 or signals.oldest_wait_s > policy.target_queue_s / 2:
        return False
    if policy.target_pending > 0 and signals.pending > policy.target_pending * (replicas - 1):
        return False
    busy_share = signals.busy_instances / signals.instances if signals.instances else 0.0
    return busy_share * replicas <= policy.target_utilization * (replicas - 1)


def decide(policy: Policy, signals: Signals, replicas: int, now: float, state: State) -> Decision:
    """The desired worker count now, given `replicas` running; see the module's rules."""
    # the first look knows nothing of the past: the idle window starts there, not at -inf (a
    # controller started beside a busy deployment whose queue is empty for a moment keeps it)
    first = state.requests < 0
    active = first or signals.pending > 0 or signals.loads > 0 or signals.requests != state.requests
    state = replace(state, requests=signals.requests, last_active=now if active else state.last_active)

    def to(count: int, reason: str, slack_since: float | None = None) -> Decision:
        changed = count != replicas
        return Decision(
            count, replace(state, last_change=now if changed else state.last_change, slack_since=slack_since), reason
        )

    if replicas < policy.min_replicas:
        return to(policy.min_replicas, "below --min")
    if replicas > policy.max_replicas:
        return to(policy.max_replicas, "above --max")
    if replicas == 0:
        return to(max(1, policy.min_replicas), "a request came") if active else to(0, "idle")
    ratio = pressure(policy, signals, replicas)
    if ratio > 1:
        if now - state.last_change < policy.scale_up_cooldown_s:
            return to(replicas, "pressure, cooling down")
        wanted = max(replicas + 1, math.ceil(replicas * min(ratio, 2.0)))
        return to(min(policy.max_replicas, wanted), f"pressure {ratio:.2f}x the target")
    cooled = now - state.last_change >= policy.scale_down_cooldown_s
    if policy.min_replicas == 0 and now - state.last_active >= policy.idle_window_s and signals.pending == 0 and cooled:
        return to(0, f"no request for {policy.idle_window_s:g} s")
    if replicas > max(policy.min_replicas, 1) and slack(policy, signals, replicas):
        since = now if state.slack_since is None else state.slack_since
        if cooled and now - since >= policy.scale_down_cooldown_s:
            return to(replicas - 1, "slack")
        return to(replicas, "slack, cooling down", since)
    return to(replicas, "steady")

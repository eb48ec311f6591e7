"""The instance processes of one python model on one worker, counted as one report.

With `--python-isolation instance` (the default) a worker runs each instance of a python model in
a process of its own (services/worker/python/processes/isolation.py), and each process reports on its own
instance under the model's group (`InstanceRecord.group`, `group_size`). The repository counts a
group as one report of all its instances, as it counts a worker that hosts them all as threads, so
that a model is loaded when all its instances are, as in Triton:

- it serves a generation once every instance serves it (during a reload, the older generation
  until the last instance has swapped; nothing while an instance's `is_ready()` says no). While an
  instance is missing (its process starts, or starts again after a crash) the others go on serving
  the generation the group served whole before; before that, nothing serves;
- its state is UNAVAILABLE (with the reason) when an instance failed on the group's newest
  generation (a load fails when one instance fails), LOADING while an instance is missing or has
  not settled on it, READY otherwise;
- its memory is the sum of its instances', its warmup the longest.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from shared.wire.records import InstanceRecord, ModelState

GroupKey = tuple[str, str, int]  # (group, model, version)


def fold(reports: Iterable[InstanceRecord], whole: dict[GroupKey, int]) -> list[InstanceRecord]:
    """The reports with each group's members replaced by one report for the group. `whole`: the
    newest generation each group has served whole (updated here; the caller keeps it)."""
    folded: list[InstanceRecord] = []
    groups: dict[GroupKey, list[InstanceRecord]] = defaultdict(list)
    for report in reports:
        if report.group:
            groups[(report.group, report.model, report.version)].append(report)
        else:
            folded.append(report)
    for key, members in groups.items():
        folded.append(_fold_group(key, members, whole))
    return folded


def _fold_group(key: GroupKey, members: list[InstanceRecord], whole: dict[GroupKey, int]) -> InstanceRecord:
    generation = max(m.generation for m in members)
    newest = [m for m in members if m.generation == generation]
    size = max(m.group_size for m in newest)
    # a process starting (or starting again after a crash) serves nothing yet: counted as missing
    present = [m.serving_generation for m in members if m.state != ModelState.LOADING or m.serving_generation]
    complete = len(present) >= size
    serving = min(present, default=0)
    if complete and serving:
        whole[key] = max(whole.get(key, 0), serving)
    elif not complete:  # an instance is missing: what the group served whole before, if anything
        before = whole.get(key, 0)
        serving = before if present and min(present) >= before > 0 else 0
    failed = [m for m in newest if m.state == ModelState.UNAVAILABLE]
    if failed:
        state = ModelState.UNAVAILABLE
    elif not complete or any(m.state == ModelState.LOADING or m.generation != generation for m in members):
        state = ModelState.LOADING
    else:
        state = ModelState.READY
    return InstanceRecord(
        worker=key[0],
        model=key[1],
        version=key[2],
        generation=generation,
        state=state,
        reason=failed[0].reason if failed else "",
        count=sum(m.count for m in members),
        serving_generation=serving,
        warmup_ms=max(m.warmup_ms for m in members),
        load_s=max(m.load_s for m in members),
        rss_bytes=sum(m.rss_bytes for m in members),
        device_bytes=sum(m.device_bytes for m in members),
        group=key[0],
        group_size=size,
    )

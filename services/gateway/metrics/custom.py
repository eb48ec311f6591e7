"""Python models' custom metrics (`pb_utils.MetricFamily`), rendered after Triton's own on
`/metrics`.

Workers publish their models' families with every heartbeat; each gateway keeps the last
snapshot of each worker (a scrape never waits on a worker) and forgets a worker silent for
`STALE_S`. A model may run on several workers: samples with the same family and labels are
summed (counters and histograms add up as they would in one Triton process; a gauge is
summed too, so a per-worker gauge should carry a label of its own).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from services.gateway.metrics.prometheus_text import family_lines, histogram_lines
from shared.wire import subjects
from shared.wire.control import MetricSample, MetricSnapshot, WorkerMetrics

log = logging.getLogger("shoal.gateway")
STALE_S = 10.0
_decoder = msgspec.msgpack.Decoder(WorkerMetrics)


class CustomMetrics:
    def __init__(self) -> None:
        self.snapshots: dict[str, tuple[float, list[MetricSnapshot]]] = {}  # worker -> (received, families)

    async def start(self, nc: NATS) -> None:
        await nc.subscribe(subjects.WORKER_METRICS, cb=self._on_snapshot)

    async def _on_snapshot(self, msg: Msg) -> None:
        try:
            metrics = _decoder.decode(msg.data)
        except msgspec.DecodeError as exc:
            log.warning("unreadable custom metrics on %s: %s", msg.subject, exc)
            return
        self.snapshots[metrics.worker] = (time.monotonic(), metrics.families)

    def lines(self) -> list[str]:
        now = time.monotonic()
        for worker in [w for w, (at, _) in self.snapshots.items() if now - at > STALE_S]:
            del self.snapshots[worker]
        return render_custom(merge([families for _, families in self.snapshots.values()]))


@dataclass
class Merged:
    """A family summed over workers: its samples by their sorted labels."""

    description: str
    kind: str
    samples: dict[tuple[tuple[str, str], ...], MetricSample] = field(default_factory=dict)


def merge(snapshots: list[list[MetricSnapshot]]) -> dict[str, Merged]:
    families: dict[str, Merged] = {}
    for snapshot in snapshots:
        for family in snapshot:
            merged = families.setdefault(family.name, Merged(family.description, family.kind))
            if merged.kind != family.kind:
                continue  # two models disagree on a family's kind: the first one seen wins
            for sample in family.samples:
                key = tuple(sorted(sample.labels.items()))
                into = merged.samples.get(key)
                if into is None or into.buckets != sample.buckets:
                    merged.samples[key] = msgspec.structs.replace(sample, counts=list(sample.counts))
                    continue
                into.value += sample.value
                into.sum += sample.sum
                into.counts = [a + b for a, b in zip(into.counts, sample.counts)]
    return families


def render_custom(families: dict[str, Merged]) -> list[str]:
    lines: list[str] = []
    for name, family in sorted(families.items()):
        samples = [(dict(key), sample) for key, sample in family.samples.items()]
        if family.kind == "histogram":
            lines += histogram_lines(
                name, family.description, [(labels, s.buckets, s.counts, s.sum) for labels, s in samples]
            )
        else:
            lines += family_lines(name, family.description, family.kind, [(labels, s.value) for labels, s in samples])
    return lines

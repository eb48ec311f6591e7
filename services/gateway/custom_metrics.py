"""Python models' custom metrics (`pb_utils.MetricFamily`), gathered from every worker and
rendered after Triton's own on `/metrics`.

A model may run on several workers: samples with the same family and labels are summed
(counters and histograms add up across instances as they would in one Triton process; a
gauge is summed too, so a per-worker gauge should carry a label of its own).
"""

from __future__ import annotations

from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from services.gateway.metrics_text import family_lines, histogram_lines
from shared import bus, subjects


async def gather_custom(nc: NATS) -> list[list[dict]]:
    answers = await bus.gather(nc, subjects.WORKER_METRICS, timeout=1.0)
    snapshots = []
    for answer in answers:
        try:
            snapshots.append(msgspec.json.decode(answer))
        except msgspec.DecodeError:
            continue
    return snapshots


def merge(snapshots: list[list[dict]]) -> dict[str, dict[str, Any]]:
    families: dict[str, dict[str, Any]] = {}
    for snapshot in snapshots:
        for family in snapshot:
            merged = families.setdefault(family["name"], {"description": family["description"],
                                                          "kind": family["kind"], "samples": {}})
            if merged["kind"] != family["kind"]:
                continue  # two models disagree on a family's kind: the first one seen wins
            for sample in family["samples"]:
                key = tuple(sorted(sample["labels"].items()))
                into = merged["samples"].get(key)
                if into is None or into["buckets"] != sample["buckets"]:
                    merged["samples"][key] = {**sample, "counts": list(sample["counts"])}
                    continue
                into["value"] += sample["value"]
                into["sum"] += sample["sum"]
                into["counts"] = [a + b for a, b in zip(into["counts"], sample["counts"])]
    return families


def render_custom(families: dict[str, dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for name, family in sorted(families.items()):
        samples = [(dict(key), sample) for key, sample in family["samples"].items()]
        if family["kind"] == "histogram":
            lines += histogram_lines(name, family["description"],
                                     [(labels, s["buckets"], s["counts"], s["sum"]) for labels, s in samples])
        else:
            lines += family_lines(name, family["description"], family["kind"],
                                  [(labels, s["value"]) for labels, s in samples])
    return lines

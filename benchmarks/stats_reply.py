#!/usr/bin/env python3
"""The scheduler's statistics reply on the bus, in a loop: a reply built from the scheduler's
counters (services/scheduler/statistics/report.py) encoded, then decoded by a gateway with its
type (inference/replica_statistics.py), as MessagePack (what Shoal sends) or JSON: the one cost that the
choice of encoding changes (building the reply, mostly its quantiles, and merging do not).

usage: python benchmarks/stats_reply.py [ITERATIONS] [msgpack|json] [VERSIONS]

Under `valgrind --tool=callgrind`, two runs with different ITERATIONS give the instructions per
reply of exactly this code, free of the bus and of timing (docs/performance.md, "Compiled
code"); VERSIONS (default 20) is how many model versions the reply holds, each with a summary's
five quantiles. Without valgrind it prints µs per iteration.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from services.scheduler.statistics.report import report
from services.scheduler.statistics.stats import ModelStats
from shared.wire.messages import encode
from shared.wire.statistics import SchedulerStatistics

QUANTILES = [0.5, 0.9, 0.95, 0.99, 0.999]


@dataclass
class Queue:
    key: tuple[str, int]
    stats: ModelStats = field(default_factory=ModelStats)
    free: list[str] = field(default_factory=lambda: ["w1", "w2"])
    cache_enabled: bool = False


def queues(versions: int) -> list[Queue]:
    made = [Queue((f"model_{i}", 1)) for i in range(versions)]
    for q in made:
        for size in (1, 2, 4, 8):
            q.stats.record_batch(size, size, 1_000, 50_000, 2_000)
            q.stats.record_queue(3_000)
            q.stats.record_request(True, 60_000)
        q.stats.worker_compute_ns["w1"] = 10**9
        q.stats.worker_executions["w1"] = 4
    return made


def main() -> None:
    iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    form = sys.argv[2] if len(sys.argv) > 2 else "msgpack"
    served = queues(int(sys.argv[3]) if len(sys.argv) > 3 else 20)
    encoder: Any = encode if form == "msgpack" else msgspec.json.encode
    decoder: Any = (msgspec.msgpack.Decoder if form == "msgpack" else msgspec.json.Decoder)(SchedulerStatistics)
    built = report(served, lambda model: True, QUANTILES, lambda q: 0)
    reply = encoder(built)
    assert decoder.decode(reply) == built
    started = time.perf_counter()
    for _ in range(iterations):
        decoder.decode(encoder(built))
    elapsed = time.perf_counter() - started
    print(f"{form}: {len(reply)} bytes, {elapsed / max(iterations, 1) * 1e6:.1f} µs per reply")


if __name__ == "__main__":
    main()

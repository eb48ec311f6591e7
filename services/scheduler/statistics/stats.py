"""Per-model-version inference statistics in Triton's schema (docs/triton-spec.md §1.10)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from services.scheduler.statistics.latency import Latencies
from services.scheduler.statistics.reasons import FailReason
from shared.wire import statistics as wire


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += max(0, ns)

    def snapshot(self) -> wire.Duration:
        return wire.Duration(self.count, self.ns)


@dataclass
class BatchStat:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class ModelStats:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    batches: dict[int, BatchStat] = field(default_factory=dict)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    fail_reasons: dict[str, int] = field(default_factory=dict)
    latencies: Latencies = field(default_factory=Latencies)
    worker_compute_ns: dict[str, int] = field(default_factory=dict)  # instance utilisation, per worker
    worker_executions: dict[str, int] = field(default_factory=dict)
    retries: int = 0  # requests sent to another instance after their worker died before starting them

    def record_batch(self, batch_size: int, requests: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One execution: each request in it is charged the batch's compute times, as Triton does."""
        self.execution_count += 1
        self.inference_count += batch_size
        self.last_inference_ms = int(time.time() * 1000)
        input_ns, infer_ns, output_ns = max(0, input_ns), max(0, infer_ns), max(0, output_ns)
        stat = self.batches.get(batch_size)
        if stat is None:
            stat = self.batches[batch_size] = BatchStat()
        # attributes updated in place, not through Duration.add: this runs for every batch
        for total, per_batch, ns in (
            (self.compute_input, stat.compute_input, input_ns),
            (self.compute_infer, stat.compute_infer, infer_ns),
            (self.compute_output, stat.compute_output, output_ns),
        ):
            total.count += requests
            total.ns += ns * requests
            per_batch.count += 1
            per_batch.ns += ns
        self.latencies.add("compute_input", input_ns, requests)
        self.latencies.add("compute_infer", infer_ns, requests)
        self.latencies.add("compute_output", output_ns, requests)

    def record_queue(self, ns: int) -> None:
        self.queue.add(ns)
        self.latencies.add("queue", ns)

    def record_request(
        self,
        ok: bool,
        duration_ns: int,
        reason: FailReason = FailReason.BACKEND,
        *,
        first_response_ns: int | None = None,
        responded: bool = True,
    ) -> None:
        """A request ended after `duration_ns`. Its time to the first response (`first_response_ns`,
        else its duration: a single response ends it) goes to the histogram when it was answered
        at all (`responded`), success or error, as Triton observes it for every response sent."""
        if responded:
            self.latencies.first_response(duration_ns if first_response_ns is None else first_response_ns)
        if ok:
            self.success.add(duration_ns)
            self.latencies.add("request", duration_ns)
        else:
            self.fail.add(duration_ns)
            self.fail_reasons[str(reason)] = self.fail_reasons.get(str(reason), 0) + 1

    def record_cache_lookup(self, hit: bool, lookup_ns: int, duration_ns: int) -> None:
        """A gateway's response-cache lookup: a hit is a successful request that never queued."""
        if hit:
            self.cache_hit.add(lookup_ns)
            self.record_request(True, duration_ns)
            self.queue.add(0)  # Triton's queue count includes cache hits
        else:
            self.cache_miss.add(lookup_ns)

    def statistics(self, name: str, version: str) -> wire.ModelStatistics:
        """This version's statistics in Triton's schema, as the statistics extension answers them."""
        return wire.ModelStatistics(
            name=name,
            version=version,
            last_inference=self.last_inference_ms,
            inference_count=self.inference_count,
            execution_count=self.execution_count,
            inference_stats=wire.InferenceStats(
                success=self.success.snapshot(),
                fail=self.fail.snapshot(),
                queue=self.queue.snapshot(),
                compute_input=self.compute_input.snapshot(),
                compute_infer=self.compute_infer.snapshot(),
                compute_output=self.compute_output.snapshot(),
                cache_hit=self.cache_hit.snapshot(),
                cache_miss=self.cache_miss.snapshot(),
            ),
            batch_stats=[
                wire.BatchStats(
                    size, b.compute_input.snapshot(), b.compute_infer.snapshot(), b.compute_output.snapshot()
                )
                for size, b in sorted(self.batches.items())
            ],
        )

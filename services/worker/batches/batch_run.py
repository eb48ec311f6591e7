"""One batch's state on a worker, from its arrival to its last response (`BatchRun`), and the
steps of its path that need nothing but that state. `batch_executor.py` runs it."""

from __future__ import annotations

import logging
import time

from services.worker.backends.runner import Batch, Result, Tensors, Work
from services.worker.batches.decoupled_streams import ResponseStream
from services.worker.batches.instances import Instance, LoadedModel
from services.worker.batches.replies import Replies
from services.worker.sequences.controls import control_arrays, pad_slots
from shared.bus.local_channel import FrameSink
from shared.errors import Code
from shared.process.logcontext import request_ids
from shared.wire.messages import BatchDelivery, ExecBatch, InferRequest, InferResponse, InstanceFree, SeqControl

log = logging.getLogger("shoal.worker")


class BatchRun:
    """A batch as it goes: what arrived, what is answered so far, and what the model was given."""

    __slots__ = (
        "loaded",
        "instance",
        "batch",
        "holds_credit",
        "requests",
        "free",
        "replies",
        "controls",
        "ran",
        "rows",
        "started_ns",
        "inputs_ns",
        "channel",
        "here",
        "streams",
    )

    def __init__(
        self,
        loaded: LoadedModel,
        instance: Instance,
        batch: ExecBatch,
        holds_credit: bool,
        free: InstanceFree,
        channel: FrameSink | None = None,
    ) -> None:
        self.loaded = loaded
        self.instance = instance
        self.batch = batch
        self.holds_credit = holds_credit  # False: run outside the instance's credits (none to give back)
        self.requests: list[InferRequest] = []  # all of the batch's, decoded
        self.free = free  # the completion: the credit back, with the batch's timings and the requests' outcomes
        self.replies = Replies(batch.reply_via_scheduler)  # the answers so far
        self.controls: dict[str, SeqControl] = {}  # sequence models: each request's control, by rid
        self.ran: list[InferRequest] = []  # the requests the model was handed, in its batch's order
        self.rows: list[int] = []  # direct sequence batching: each request's row in the model's batch
        self.started_ns = 0  # monotonic: reading the inputs began
        self.inputs_ns = 0  # the inputs were in the model's form
        self.channel = channel  # the local channel it came by: its completion goes back there (docs/design.md §9)
        self.here = False  # run on the hot loop's thread from its arrival to its answer (`run_here`)
        self.streams: dict[str, ResponseStream] = {}  # a decoupled model's: each request's, by rid

    def arrived(self, requests: list[InferRequest]) -> list[InferRequest]:
        """The batch's requests decoded: labels its log lines, and answers those nobody waits for
        any more as skipped; returns the others."""
        self.requests = requests
        if self.batch.controls:  # the scheduler's per-request lists line up with all of the batch's requests
            self.controls = dict(zip([r.rid for r in requests], self.batch.controls))
        request_ids.set(",".join([f"{r.id}/{r.rid}" if r.id else r.rid for r in requests]))
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "batch %d of '%s' version %d: %d request(s) on instance %d (%s)",
                self.batch.batch_id,
                self.batch.model,
                self.batch.version,
                len(requests),
                self.instance.index,
                self.batch.reason,
            )
        now = time.time_ns()
        live = []
        for request in requests:
            if request.deadline_ns > now:
                live.append(request)
            else:
                self.replies.skip(request)
        self.started_ns = time.monotonic_ns()
        return live

    def with_controls(self, request: InferRequest, inputs: Tensors) -> Tensors:
        """Sequence models: a request's control tensors and implicit state join its inputs."""
        control = self.controls.get(request.rid)
        if control is not None:
            loaded = self.loaded
            if loaded.sequence is not None:
                inputs.update(control_arrays(loaded.sequence, control))
            if loaded.states is not None:
                inputs.update(loaded.states.inputs(control, self.instance.index))
        return inputs

    def model_batch(self, work: list[Work]) -> Batch:
        """What the model is handed: one `Work` per request of `ran`; with direct sequence batching,
        each request in its slot's row, the empty slots below as not-ready rows (`rows` says where)."""
        loaded, ran = self.loaded, self.ran
        deadline = min(r.deadline_ns for r in ran)
        states = loaded.states if self.controls else None
        extra = list(states.output_names) if states is not None else []
        if states is not None and loaded.sequence is not None and self.direct():
            padded, self.rows = pad_slots(
                loaded.sequence, [self.controls[r.rid] for r in ran], [w.inputs for w in work], states.initial()
            )
            names = sorted({n for w in work for n in w.outputs})
            return Batch([Work(row, names) for row in padded], deadline, extra)
        return Batch(work, deadline, extra)

    def direct(self) -> bool:
        sequence = self.loaded.sequence
        return (
            sequence is not None
            and sequence.strategy == "direct"
            and self.loaded.spec.max_batch_size > 0
            and self.instance.runner.batches_rows
        )

    def results(self, model_batch: Batch, results: list[Result]) -> list[Result]:
        """The model's results in `ran`'s order; the batch's timings go into the completion."""
        computed = time.monotonic_ns()
        self.inputs_ns = model_batch.inputs_done_ns or self.started_ns
        self.free.batch_size = sum(r.batch_size for r in self.ran)
        self.free.compute_input_ns = self.inputs_ns - self.started_ns
        self.free.compute_infer_ns = computed - self.inputs_ns
        return [results[row] for row in self.rows] if self.rows else results

    def delivery(self, worker_id: str) -> BatchDelivery:
        return BatchDelivery(self.free.batch_size, len(self.ran), self.batch.reason, worker_id, self.instance.index)

    def settle(self) -> None:
        """The batch is over on this instance: its credit comes back (or the instance closes)."""
        loaded, instance, batch = self.loaded, self.instance, self.batch
        if loaded.states is not None:  # an END that failed or was skipped still ends the sequence here
            for control in batch.controls:
                if control.end:
                    loaded.states.drop(control.corrid, control.seq)
        if self.holds_credit:
            instance.idle.add(batch.credit)
        else:
            instance.uncredited -= 1
        if loaded.retired and not instance.busy:
            instance.close()
        if loaded.retired or loaded.draining or not self.holds_credit:
            self.free.instance = -1  # tells the scheduler this is not a credit


def unreadable(request: InferRequest, exc: Exception) -> InferResponse:
    code = Code.INVALID_ARG if isinstance(exc, ValueError) else Code.INTERNAL
    return InferResponse(request.rid, error=f"cannot read the inputs: {exc}", code=str(code))


def enqueued(batch: ExecBatch, requests: list[InferRequest]) -> dict[str, int]:
    """When each request was queued (for its trace), when the scheduler says."""
    return dict(zip([r.rid for r in requests], batch.enqueued_ns)) if batch.enqueued_ns else {}

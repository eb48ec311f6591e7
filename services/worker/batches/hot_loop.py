"""The hot loop of a python model's instance process (docs/design.md §9): a batch that comes by the
local channel is read, run and answered on the channel's reading thread, as Triton's stub runs one
plain loop (read a request, call `execute`, write the response), with no turn of the event loop and
no hand-off to the instance's thread and back.

`take` decides on the reading thread whether it can; everything it declines goes to the event loop
as before (`WorkerService._batch_arrived`): a batch of a model that is decoupled or sequence-batched
(their streams and state live on the loop), one whose inputs wait in the tensor store, one whose
credit is not idle here (a duplicate), one for a generation or a model this process does not run as
current. What runs here is `BatchExecutor.run_here`: the same steps, errors and answers as the
loop's path, the model under the instance's lock (`Instance.lock`), so that a batch that came over
NATS meanwhile waits for it on the instance's thread.
"""

from __future__ import annotations

import logging

import msgspec

from services.worker.batches.batch_executor import BatchExecutor
from services.worker.batches.instances import LoadedModel
from shared.bus.local_channel import FrameSink
from shared.wire.messages import ExecBatch, InferRequest

log = logging.getLogger("shoal.worker")

_batch_decoder = msgspec.msgpack.Decoder(ExecBatch)
_request_decoder = msgspec.msgpack.Decoder(InferRequest)


class HotLoop:
    def __init__(self, models: dict[tuple[str, int], LoadedModel], batches: BatchExecutor) -> None:
        self.models = models  # the worker's loaded models (ModelLifecycle's own dict, read here)
        self.batches = batches
        self.ran = 0  # batches run here (`WorkerStatus.batches_hot_loop`); written by reading threads only

    def take(self, data: bytes, channel: FrameSink) -> bool:
        """Run the batch `data` on this thread, to its answer; False (nothing done) when the event
        loop must run it."""
        try:
            batch = _batch_decoder.decode(data)
            loaded = self.models.get((batch.model, batch.version))
            if (
                loaded is None
                or loaded.retired
                or batch.generation != loaded.generation
                or not 0 <= batch.instance < len(loaded.instances)
                or loaded.spec.decoupled
                or loaded.sequence is not None
                or loaded.states is not None
                or batch.controls
            ):
                return False
            instance = loaded.instances[batch.instance]
            if instance.closed or batch.credit not in instance.idle:
                return False
            requests = [_request_decoder.decode(raw) for raw in batch.requests]
            if any(ref.data is None for request in requests for ref in request.inputs):
                return False  # fetched from the tensor store first: on the loop
        except Exception:  # the loop's path reports it
            return False
        instance.idle.discard(batch.credit)
        self.ran += 1
        self.batches.run_here(loaded, instance, batch, requests, channel)
        return True

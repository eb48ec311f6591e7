"""A request's outputs as a response: datatypes checked, shared-memory regions written, the
rest inline (up to a per-response budget) or handed to the tensor store."""

from __future__ import annotations

from services.worker.backends.runner import Tensors
from shared.bus.tensor_store import INLINE_BUDGET, TensorStore
from shared.config.datatypes import protocol_dtype, to_bytes
from shared.config.model_config import ModelSpec
from shared.errors import Code, ShoalError
from shared.memory.segments import region_too_small, write_region
from shared.wire.deadlines import seconds_left
from shared.wire.messages import InferRequest, InferResponse, TensorRef

_Encoded = tuple[str, str, list[int], bytes | memoryview]
SMALL_BYTES = 16 * 1024
# the built-in tensor backends, whose outputs must have their config's datatypes
_CHECKED = frozenset({"onnxruntime", "pytorch", "tensorrt", "identity", "repeat", "square", "fil", "openvino", "dali"})


class Outputs:
    def __init__(self, store: TensorStore) -> None:
        self.store = store

    def response(
        self,
        spec: ModelSpec,
        version: int,
        request: InferRequest,
        piece: Tensors,
        small: bool = False,
        partial: bool = False,
    ) -> InferResponse:
        """Outputs inline up to a per-response budget (all out of line when the response must
        stay small: it rides in the scheduler's completion message). `partial`: a decoupled
        model's response carries the outputs it sent, not necessarily all asked for."""
        ttl = seconds_left(request.deadline_ns, 1.0)
        names = request.outputs or [o.name for o in spec.outputs]
        outputs = [_encode(spec, name, piece) for name in ([n for n in names if n in piece] if partial else names)]
        regions = request.output_regions
        if regions:  # every region is checked before any is written
            for name, _, _, payload in outputs:
                region = regions.get(name)
                if region is not None and memoryview(payload).nbytes > region.nbytes:
                    raise region_too_small(name, region, memoryview(payload).nbytes)
        budget = 0 if small else INLINE_BUDGET
        refs: list[TensorRef] = []
        for name, datatype, shape, payload in outputs:
            nbytes = memoryview(payload).nbytes
            region = regions.get(name) if regions else None
            if region is not None and write_region(region, payload, self.store.host):
                refs.append(TensorRef(name, datatype, shape, nbytes=nbytes, in_region=True))
                continue
            # no region, or one on another host (the gateway writes it)
            ref = self.store.put(name, datatype, shape, payload, ttl, inline=nbytes <= budget)
            budget -= nbytes if ref.data is not None else 0
            refs.append(ref)
        response = InferResponse(request.rid, spec.name, version, refs)
        parameters = getattr(piece, "parameters", None)  # a backend's response parameters (runner.Answer)
        if parameters:
            response.parameters = parameters
        return response

    def streamed(self, spec: ModelSpec, version: int, request: InferRequest, piece: Tensors) -> InferResponse:
        """One response of a decoupled model: the outputs it sent (a stream may send a few)."""
        return self.response(spec, version, request, piece, small=False, partial=True)


def _encode(spec: ModelSpec, name: str, piece: Tensors) -> _Encoded:
    array = piece[name]
    tensor = spec.output(name)
    datatype = protocol_dtype(array.dtype)
    # python_backend (and a python-based backend) sends a tensor with the datatype the model made it
    # with, core checks none: NVIDIA's bls_decoupled examples answer an INT64 sum for an INT32 output
    if tensor is not None and tensor.datatype != datatype and spec.backend in _CHECKED:
        raise ShoalError(
            f"unexpected datatype {datatype} for inference output '{name}', expecting {tensor.datatype}",
            Code.INTERNAL,
        )
    if datatype != "BYTES" and array.nbytes <= SMALL_BYTES:  # one call and one copy, made anyway to travel inline
        return name, datatype, list(array.shape), array.tobytes()
    return name, datatype, list(array.shape), to_bytes(array, datatype)

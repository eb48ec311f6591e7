"""Triton's qa/L0_backend_python/decoupled BLS-cancel models, as Shoal's tests serve them:
`response_sender_until_cancelled` (qa/python_models) repeats INPUT until its request is cancelled or
MAX_RESPONSE_COUNT responses went out, and the callers sum its stream over `exec(decoupled=True)`
or `async_exec(decoupled=True)`, calling `cancel()` once the sum reaches MAX_SUM.

One change to the callee: between responses it waits for the cancellation with DELAY as its
deadline instead of sleeping DELAY. Triton's QA sleeps 50 ms and counts on the cancel arriving
within it (SUM is MAX_SUM exactly); on a loaded machine one more response may be sent before the
cancel arrives, so the tests take MAX_SUM <= SUM < all 20 responses."""

from __future__ import annotations

from pathlib import Path

CALLEE = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def wait_cancelled(request, delay_s):
    deadline = time.monotonic() + delay_s
    while time.monotonic() < deadline and not request.is_cancelled():
        time.sleep(0.005)


class TritonPythonModel:
    def execute(self, requests):
        request = requests[0]
        value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
        max_response_count = pb_utils.get_input_tensor_by_name(request, "MAX_RESPONSE_COUNT").as_numpy()[0]
        delay = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()[0]
        ignore_cancel = pb_utils.get_input_tensor_by_name(request, "IGNORE_CANCEL").as_numpy()[0]
        sender = request.get_response_sender()
        sent = 0
        while True:
            if not ignore_cancel and request.is_cancelled():
                error = pb_utils.TritonError("request has been cancelled", pb_utils.TritonError.CANCELLED)
                sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                break
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array([value[0]], np.int32))])
            if sent + 1 == max_response_count:
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                break
            sender.send(response)
            sent += 1
            wait_cancelled(request, delay / 1000)
        return None
"""

CALLEE_CONFIG = """
name: "response_sender_until_cancelled"
backend: "python"
model_transaction_policy { decoupled: True }
input [
  { name: "MAX_RESPONSE_COUNT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "DELAY" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IGNORE_CANCEL" data_type: TYPE_BOOL dims: [ 1 ] }
]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [{ kind: KIND_CPU }]
"""

# the callers' shared body; {exec} is how the stream starts, {after} what follows the loop
CALLER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    {define}execute(self, requests):
        max_sum = pb_utils.get_input_tensor_by_name(requests[0], "MAX_SUM").as_numpy().flat[0]
        value = pb_utils.get_input_tensor_by_name(requests[0], "INPUT")
        ignore_cancel = pb_utils.get_input_tensor_by_name(requests[0], "IGNORE_CANCEL")
        delay_ms = 20 if ignore_cancel.as_numpy()[0] else 200
        delay = pb_utils.Tensor("DELAY", np.array([delay_ms], dtype=np.int32))
        max_response_count = pb_utils.Tensor("MAX_RESPONSE_COUNT", np.array([20], dtype=np.int32))
        infer_request = pb_utils.InferenceRequest(
            model_name="response_sender_until_cancelled",
            inputs=[value, max_response_count, delay, ignore_cancel],
            requested_output_names=["OUTPUT"],
        )
        response_stream = {exec}
        is_cancelled = False
        error = None
        response_sum = 0
        for infer_response in response_stream:
            if infer_response.has_error():
                if infer_response.error().code() == pb_utils.TritonError.CANCELLED:
                    is_cancelled = True
                else:
                    error = infer_response.error()
                break
            response_sum += pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT").as_numpy()[0]
            if response_sum >= max_sum:
                response_stream.cancel()
{after}
        outputs = [
            pb_utils.Tensor("SUM", np.array([response_sum], dtype=np.int32)),
            pb_utils.Tensor("IS_CANCELLED", np.array([is_cancelled], dtype=np.bool_)),
        ]
        return [pb_utils.InferenceResponse(output_tensors=outputs, error=error)]
"""

AFTER_COMPLETE = """
        if not error:  # a cancel after the stream ended: nothing happens
            try:
                response_stream.cancel()
            except Exception as e:
                error = pb_utils.TritonError(message=str(e), code=pb_utils.TritonError.INTERNAL)
"""

CALLERS = {
    "decoupled_bls_cancel": CALLER.format(define="def ", exec="infer_request.exec(decoupled=True)", after=""),
    "decoupled_bls_async_cancel": CALLER.format(
        define="async def ", exec="await infer_request.async_exec(decoupled=True)", after=""
    ),
    "decoupled_bls_cancel_after_complete": CALLER.format(
        define="async def ", exec="await infer_request.async_exec(decoupled=True)", after=AFTER_COMPLETE
    ),
}

# two streams to the one-instance callee: the second waits in its queue behind the first and is
# cancelled there; its iterator ends with the scheduler's CANCELLED answer (SUM: what it yielded)
QUEUED = """
import numpy as np
import triton_python_backend_utils as pb_utils


def stream(value, ignore_cancel, delay_ms):
    inputs = [
        value,
        pb_utils.Tensor("MAX_RESPONSE_COUNT", np.array([20], dtype=np.int32)),
        pb_utils.Tensor("DELAY", np.array([delay_ms], dtype=np.int32)),
        pb_utils.Tensor("IGNORE_CANCEL", np.array([ignore_cancel], dtype=np.bool_)),
    ]
    request = pb_utils.InferenceRequest(
        model_name="response_sender_until_cancelled", inputs=inputs, requested_output_names=["OUTPUT"]
    )
    return request.exec(decoupled=True)


class TritonPythonModel:
    def execute(self, requests):
        value = pb_utils.get_input_tensor_by_name(requests[0], "INPUT")
        first = stream(value, False, 60000)  # holds the instance until cancelled
        first_response = next(iter(first))  # it runs: the second one must queue
        second = stream(value, False, 20)
        second.cancel()
        errors = [r.error() for r in second if r.has_error()]
        total = len([r for r in second if not r.has_error()])
        first.cancel()
        rest = list(first)
        is_cancelled = bool(errors) and errors[0].code() == pb_utils.TritonError.CANCELLED
        is_cancelled = is_cancelled and not first_response.has_error() and rest[-1].has_error()
        outputs = [
            pb_utils.Tensor("SUM", np.array([total], dtype=np.int32)),
            pb_utils.Tensor("IS_CANCELLED", np.array([is_cancelled], dtype=np.bool_)),
        ]
        return [pb_utils.InferenceResponse(output_tensors=outputs)]
"""

CALLER_CONFIG = """
name: "{name}"
backend: "python"
input [
  {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "MAX_SUM" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "IGNORE_CANCEL" data_type: TYPE_BOOL dims: [ 1 ] }}
]
output [
  {{ name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "IS_CANCELLED" data_type: TYPE_BOOL dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def _model(root: Path, name: str, source: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(source)
    (root / name / "config.pbtxt").write_text(config)


def write_models(root: Path) -> Path:
    _model(root, "response_sender_until_cancelled", CALLEE, CALLEE_CONFIG)
    for name, source in {**CALLERS, "decoupled_bls_cancel_queued": QUEUED}.items():
        _model(root, name, source, CALLER_CONFIG.format(name=name))
    return root

"""Non-decoupled python models that answer through `request.get_response_sender()` (python_backend
since 23.10), after Triton's qa/L0_backend_python/response_sender: each request's MODE input says
how its model answers it. OUT = IN + 1 for a response sent, IN + 2 for a second one sent,
IN + 0 for one returned."""

from __future__ import annotations

from pathlib import Path

SEND = 0  # one response with the final flag, from execute
SEND_THEN_FINAL = 1  # the response, then the final flag alone
LATER = 2  # from a thread (a task on the event loop, for async execute) after execute returned
RETURN = 3  # returned, the sender untouched
TWO = 4  # two responses: the second raises "cannot send more than one response"
FINAL_ONLY = 5  # the final flag with no response: raises
SEND_AND_RETURN = 6  # sent with the final flag, and returned too: the execute fails after it

MODEL = """
import asyncio
import threading
import time

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def response(request, offset):
    value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value + offset)])


def send_later(request):
    time.sleep(0.3)
    request.get_response_sender().send(response(request, 1), FINAL)


async def send_soon(request):
    await asyncio.sleep(0.3)
    request.get_response_sender().send(response(request, 1), FINAL)


def answer(request, loop):
    mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy().item())
    if mode == 3:
        return response(request, 0)
    if mode == 2:
        if loop is None:
            threading.Thread(target=send_later, args=(request,)).start()
        else:
            loop.create_task(send_soon(request))
        return None
    sender = request.get_response_sender()
    if mode == 5:
        sender.send(flags=FINAL)
    sender.send(response(request, 1), FINAL if mode in (0, 6) else 0)
    if mode == 1:
        sender.send(flags=FINAL)
    if mode == 4:
        sender.send(response(request, 2), FINAL)
    return response(request, 0) if mode == 6 else None


def answer_all(requests, loop=None):
    returned = [answer(request, loop) for request in requests]
    return None if all(r is None for r in returned) else returned


class TritonPythonModel:
    def execute(self, requests):
        return answer_all(requests)
"""

ASYNC_MODEL = MODEL.replace(
    "    def execute(self, requests):\n        return answer_all(requests)",
    "    async def execute(self, requests):\n        return answer_all(requests, asyncio.get_running_loop())",
)
assert ASYNC_MODEL != MODEL

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }}, {{ name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
"""


def write_models(root: Path) -> Path:
    """`sender` (execute) and `sender_async` (async def execute) under `root`."""
    for name, source in (("sender", MODEL), ("sender_async", ASYNC_MODEL)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    return root

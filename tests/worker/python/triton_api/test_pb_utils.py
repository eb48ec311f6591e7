"""The triton_python_backend_utils shim's pure parts: auto-complete config, response senders, DLPack."""

import asyncio

import numpy as np
import pytest

from services.worker.python.triton_api import pb_utils


def test_auto_complete_fills_and_checks():
    config = pb_utils.ModelConfig(
        {"name": "m", "max_batch_size": 0, "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": []}]}
    )
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]})  # fills the missing dims
    config.add_output({"name": "B", "data_type": "TYPE_INT64", "dims": [1]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    assert config.as_dict() == {
        "name": "m",
        "max_batch_size": 8,
        "dynamic_batching": {},
        "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "B", "data_type": "TYPE_INT64", "dims": [1]}],
    }
    with pytest.raises(ValueError, match="configuration expects data_type TYPE_FP32"):
        config.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [4]})
    with pytest.raises(ValueError, match="max_batch_size"):
        config.set_max_batch_size(4)
    with pytest.raises(ValueError, match="missing 'dims'"):
        config.add_output({"name": "C", "data_type": "TYPE_FP32"})
    with pytest.raises(ValueError, match="sequence_batching"):
        pb_utils.ModelConfig({"sequence_batching": {"direct": {}}}).set_dynamic_batching()


def test_response_sender_closes_on_final():
    sent = []
    sender = pb_utils.InferenceResponseSender(lambda response, flags: sent.append(flags), lambda: False)
    with pytest.raises(pb_utils.TritonModelException, match="must be provided"):
        sender.send(None, 0)
    sender.send(pb_utils.InferenceResponse(), 0)
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(pb_utils.TritonModelException, match="has been closed"):
        sender.send(pb_utils.InferenceResponse())
    assert sent == [0, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL] and sender.closed


def test_a_non_decoupled_sender_sends_one_response():
    """python_backend's response_sender.cc rules for a model that is not decoupled."""
    sent = []
    sender = pb_utils.InferenceResponseSender(lambda r, flags: sent.append(flags), lambda: False, decoupled=False)
    final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    with pytest.raises(pb_utils.TritonModelException, match="cannot send complete final before sending a response"):
        sender.send(flags=final)
    with pytest.raises(pb_utils.TritonModelException, match="Unsupported flag provided"):
        sender.send(pb_utils.InferenceResponse(), 2)
    sender.send(pb_utils.InferenceResponse())
    with pytest.raises(pb_utils.TritonModelException, match="cannot send more than one response"):
        sender.send(pb_utils.InferenceResponse(), final)
    sender.send(flags=final)  # the final flag alone, after the one response
    assert sent == [0, final] and sender.closed
    with pytest.raises(pb_utils.TritonModelException, match="cannot send more than one response"):
        sender._returned(pb_utils.InferenceResponse())  # execute returned one too


def test_dlpack_round_trip_and_bls_outside_a_worker():
    tensor = pb_utils.Tensor("x", np.arange(6, dtype=np.float32).reshape(2, 3))
    back = pb_utils.Tensor.from_dlpack("y", tensor.to_dlpack())
    np.testing.assert_array_equal(back.as_numpy(), tensor.as_numpy())
    assert back.name() == "y" and back.shape() == [2, 3]
    request = pb_utils.InferenceRequest(model_name="m", inputs=[tensor], parameters='{"a": 1}')
    assert request.parameters() == '{"a": 1}' and not request.is_cancelled()
    with pytest.raises(pb_utils.TritonModelException, match="requests execute receives"):
        request.get_response_sender()
    saved, pb_utils._runtime = pb_utils._runtime, None
    try:
        with pytest.raises(pb_utils.TritonModelException, match="running Shoal worker"):
            request.exec()
    finally:
        pb_utils._runtime = saved
    assert pb_utils.TritonError.code_of("NOT_FOUND") == pb_utils.TritonError.NOT_FOUND
    assert pb_utils.TritonError.code_of("FORBIDDEN") == pb_utils.TritonError.INTERNAL


def test_a_bytes_model_name_is_a_name():
    """python_backend's bls example passes a BYTES input's element as the name."""
    assert pb_utils.InferenceRequest(model_name=b"add_sub").model_name() == "add_sub"


def test_response_iterator_replays_once_finished_as_python_backends():
    responses = [pb_utils.InferenceResponse(parameters={"i": i}) for i in range(3)]
    cancelled = []
    iterator = pb_utils.ResponseIterator(iter(responses), lambda: cancelled.append(True))
    assert next(iterator) is responses[0]
    assert list(iterator) == responses[1:]  # resumes where it was, up to the last
    assert list(iterator) == responses  # finished: a new loop starts from the first
    with pytest.raises(StopIteration):
        next(iterator)
    iterator.cancel()  # after the final response: nothing to cancel (python_backend's is_finished_)
    assert cancelled == []


def test_cancel_asks_the_target_and_the_iterator_reads_on():
    """python_backend's cancel() only asks: what the target still sends, up to its final
    response (a CANCELLED error when it honours the cancel), is read as before."""
    cancelled: list[bool] = []
    error = pb_utils.TritonError("request has been cancelled", pb_utils.TritonError.CANCELLED)
    responses = [pb_utils.InferenceResponse(), pb_utils.InferenceResponse(error=error)]
    iterator = pb_utils.ResponseIterator(iter(responses), lambda: cancelled.append(True))
    assert next(iterator) is responses[0]
    iterator.cancel()
    assert cancelled == [True]
    assert list(iterator) == responses[1:]


def test_async_exec_decoupled_awaits_to_the_iterator_exec_returns():
    """python_backend's async_exec(decoupled=True) resolves to the same (blocking, plain `for`)
    ResponseIterator as exec(decoupled=True): its bls_decoupled async example gathers two."""
    made: list[pb_utils.ResponseIterator] = []

    class Runtime:
        def stream(self, request, deadline_ns):
            made.append(pb_utils.ResponseIterator(iter([pb_utils.InferenceResponse()]), lambda: None))
            return made[-1]

    saved, pb_utils._runtime = pb_utils._runtime, Runtime()
    try:
        request = pb_utils.InferenceRequest(model_name="square_int32")
        assert request.exec(decoupled=True) is made[-1]

        async def gather():
            return await asyncio.gather(request.async_exec(decoupled=True), request.async_exec(decoupled=True))

        results = asyncio.run(gather())
    finally:
        pb_utils._runtime = saved
    assert results == made[1:] and all(len(list(r)) == 1 for r in results)

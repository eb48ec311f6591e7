"""Triton's identity, repeat and square backends on their own: config checks with the C++
backends' texts, outputs, optional inputs, and the decoupled streams repeat and square send."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from services.worker.backends import Placement, load_backend
from services.worker.backends.runner import STREAMED, Batch, ModelError, Piece, RequestContext, Work
from services.worker.python.triton_api.custom_metrics import metrics_snapshot
from shared.config import model_config
from shared.errors import ShoalError


class Collected:
    """A request's response stream, as the worker gives one to a decoupled model."""

    def __init__(self) -> None:
        self.pieces: list[Piece] = []
        self.done = threading.Event()

    @property
    def closed(self) -> bool:
        return self.done.is_set()

    def send(self, piece: Piece) -> None:
        self.pieces.append(piece)
        if piece.final:
            self.done.set()


def create(tmp_path: Path, text: str, index: int = 0):
    config = model_config.parse_text(text)
    (tmp_path / config.name / "1").mkdir(parents=True, exist_ok=True)
    model_config.autofill_backend(config, tmp_path / config.name, [1])
    model_config.normalize(config)
    spec = model_config.spec_from_json(model_config.to_json(config))
    backend = load_backend(spec.backend)
    return spec, backend.create(spec, tmp_path / config.name, Placement(1, "KIND_CPU", 0, 1, spec.name, index))


IDENTITY = """
name: "identity_opt"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 3 ] optional: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 3 ] } ]
"""


def test_identity_copies_inputs_with_their_shapes_and_zeros_for_a_missing_optional(tmp_path):
    _, instance = create(tmp_path, IDENTITY)
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    both = Work({"INPUT0": x, "INPUT1": np.ones((2, 3), np.int32)}, ["OUTPUT0", "OUTPUT1"], 2)
    only = Work({"INPUT0": x}, ["OUTPUT0", "OUTPUT1"], 2)
    first, second = instance.execute(Batch([both, only]))
    np.testing.assert_array_equal(first["OUTPUT0"], x)
    np.testing.assert_array_equal(first["OUTPUT1"], np.ones((2, 3), np.int32))
    np.testing.assert_array_equal(second["OUTPUT1"], np.zeros((2, 3), np.int32))  # batch first, config shape
    assert second["OUTPUT1"].dtype == np.int32


def input_bytes_counted() -> float:
    families = {family.name: family for family in metrics_snapshot()}
    labels = {"model": "identity_opt", "version": "1"}
    return next(s.value for s in families["input_byte_size_counter"].samples if s.labels == labels)


def test_identity_counts_its_input_bytes_in_the_workers_custom_metrics(tmp_path):
    _, instance = create(tmp_path, IDENTITY)
    before = input_bytes_counted()  # the registry is the process's: other tests' instances share it
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    instance.execute(Batch([Work({"INPUT0": x}, ["OUTPUT0"], 2), Work({"INPUT0": x}, ["OUTPUT0"], 2)]))
    assert input_bytes_counted() - before == 2 * x.nbytes


@pytest.mark.parametrize(
    "io, message",
    [
        (
            'input [ { name: "IN0" data_type: TYPE_FP32 dims: [ 1 ] } ] output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            "expected input name to follow INPUT<index> pattern, got 'IN0'",
        ),
        (
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ] output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]',
            "expected input and output datatype to match, got TYPE_FP32 and TYPE_INT32",
        ),
        (
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ] output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] } ]',
            "expected input and output shape to match, got [2] and [3]",
        ),
        (
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ] output [ ]',
            "model configuration must have equal input/output pairs",
        ),
    ],
)
def test_identity_config_checks(tmp_path, io, message):
    with pytest.raises(ShoalError) as caught:
        create(tmp_path, f'name: "bad"\nbackend: "identity"\nmax_batch_size: 0\n{io}')
    assert caught.value.message == message


def test_identity_execute_delay_grows_with_the_instance_index(tmp_path):
    text = (
        IDENTITY
        + 'parameters [ { key: "execute_delay_ms" value: { string_value: "40" } }, '
        + ('{ key: "instance_wise_delay_multiplier" value: { string_value: "2" } } ]')
    )
    _, first = create(tmp_path, text, index=0)
    _, third = create(tmp_path, text, index=2)
    assert first.delay_s == pytest.approx(0.04) and third.delay_s == pytest.approx(0.16)
    started = time.monotonic()
    third.execute(Batch([Work({"INPUT0": np.zeros((1, 1), np.float32)}, ["OUTPUT0"])]))
    assert time.monotonic() - started >= 0.16


REPEAT = """
name: "repeat_int32"
backend: "repeat"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
        { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
"""


def test_repeat_streams_one_response_per_element_then_a_final_flag(tmp_path):
    _, instance = create(tmp_path, REPEAT)
    stream = Collected()
    inputs = {
        "IN": np.array([4, 2, 0, 7], np.int32),
        "DELAY": np.array([1, 2, 3, 4], np.uint32),
        "WAIT": np.array([5], np.uint32),
    }
    (result,) = instance.execute(Batch([Work(inputs, ["OUT", "IDX"], context=RequestContext(responses=stream))]))
    assert result is STREAMED
    assert stream.done.wait(5)
    values = [(int(p.outputs["OUT"][0]), int(p.outputs["IDX"][0])) for p in stream.pieces if p.outputs]
    assert values == [(4, 0), (2, 1), (0, 2), (7, 3)]
    assert stream.pieces[-1].final and stream.pieces[-1].outputs is None
    instance.close()


def test_repeat_config_checks(tmp_path):
    with pytest.raises(ShoalError, match="repeat backend only supports models with max_batch_size == 0"):
        create(tmp_path, REPEAT.replace("max_batch_size: 0", "max_batch_size: 4"))
    with pytest.raises(ShoalError, match="expected first input tensor name to be IN, got X"):
        create(tmp_path, REPEAT.replace('name: "IN"', 'name: "X"'))
    with pytest.raises(ShoalError, match="expected DELAY datatype to be UINT32, got TYPE_INT32"):
        create(tmp_path, REPEAT.replace('"DELAY" data_type: TYPE_UINT32', '"DELAY" data_type: TYPE_INT32'))


def test_repeat_unloaded_mid_stream_ends_the_stream_with_an_error(tmp_path):
    _, instance = create(tmp_path, REPEAT)
    stream = Collected()
    inputs = {
        "IN": np.arange(3, dtype=np.int32),
        "DELAY": np.full(3, 60_000, np.uint32),
        "WAIT": np.zeros(1, np.uint32),
    }
    instance.execute(Batch([Work(inputs, ["OUT", "IDX"], context=RequestContext(responses=stream))]))
    started = time.monotonic()
    instance.close()
    assert time.monotonic() - started < 5 and stream.done.is_set()
    assert stream.pieces[-1].error is not None and stream.pieces[-1].error.code == "UNAVAILABLE"


SQUARE = """
name: "square_int32"
backend: "square"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def run_square(instance, n: int, cancelled=lambda: False) -> Collected:
    stream = Collected()
    context = RequestContext(responses=stream, cancelled=cancelled)
    (result,) = instance.execute(Batch([Work({"IN": np.array([n], np.int32)}, ["OUT"], context=context)]))
    assert result is STREAMED and stream.done.wait(5)
    return stream


def test_square_sends_n_responses_of_n(tmp_path):
    _, instance = create(tmp_path, SQUARE)
    stream = run_square(instance, 3)
    assert [int(p.outputs["OUT"][0]) for p in stream.pieces if p.outputs] == [3, 3, 3]
    assert len(stream.pieces) == 4 and stream.pieces[-1].final
    assert run_square(instance, 0).pieces == [Piece(final=True)]  # zero responses: only the final flag


def test_square_fail_and_empty_counts(tmp_path):
    params = (
        'parameters [ { key: "CUSTOM_FAIL_COUNT" value: { string_value: "1" } }, '
        '{ key: "CUSTOM_EMPTY_COUNT" value: { string_value: "2" } }, '
        '{ key: "CUSTOM_INFER_DELAY_NS" value: { string_value: "not a number" } } ]'
    )
    _, instance = create(tmp_path, SQUARE + params)
    pieces = run_square(instance, 5).pieces
    assert [p.error.message if p.error else int(p.outputs["OUT"][0]) for p in pieces[:-1]] == [
        5,
        5,
        "simulated failure",
    ]


def test_square_stops_when_the_client_cancels(tmp_path):
    _, instance = create(tmp_path, SQUARE)
    sent: list[int] = []
    stream = run_square(instance, 1000, cancelled=lambda: len(sent) >= 2 or bool(sent.append(1)))
    assert len([p for p in stream.pieces if p.outputs]) < 1000


def test_square_needs_a_decoupled_model(tmp_path):
    _, instance = create(tmp_path, SQUARE.replace("model_transaction_policy { decoupled: true }", ""))
    (result,) = instance.execute(Batch([Work({"IN": np.array([2], np.int32)}, ["OUT"])]))
    assert isinstance(result, ModelError) and "must be decoupled" in result.message

"""The wire's Structs (shared/wire/): the control plane's requests read as the dicts they replaced,
each receiver's view reads what its sender encodes, and the replies that became Structs keep the
JSON their readers knew."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.wire.control import (
    DemandRequest,
    Eviction,
    IndexEntry,
    IndexRequest,
    LoadRequest,
    MemoryUse,
    ModelFigures,
    ModelUsage,
    RepositoryDone,
    RepositoryIndex,
    StatisticsRequest,
    UnloadRequest,
    UsageReply,
    WorkerBudget,
)
from shared.wire.messages import (
    BatchDone,
    BatchDoneView,
    InferRequest,
    InferResponse,
    InstanceFree,
    RequestDeadline,
    ResponseBatch,
    ResponseBatchView,
    TensorRef,
    encode,
)

names = st.text(min_size=1, max_size=20)
parameters = st.dictionaries(st.text(max_size=10), st.one_of(st.text(max_size=10), st.integers(), st.booleans()))


@given(names, parameters)
def test_a_load_request_round_trips_and_reads_as_the_dict_it_replaced(name, params):
    request = LoadRequest(name, params)
    assert msgspec.json.decode(msgspec.json.encode(request), type=LoadRequest) == request
    assert msgspec.json.decode(msgspec.json.encode({"name": name, "parameters": params}), type=LoadRequest) == request


@given(names, st.booleans())
def test_an_unload_request_round_trips(name, dependents):
    request = UnloadRequest(name, dependents)
    assert msgspec.json.decode(msgspec.json.encode(request), type=UnloadRequest) == request


def test_defaults_stay_off_the_wire_and_come_back_on_decode():
    assert msgspec.json.encode(UnloadRequest("m")) == b'{"name":"m"}'
    assert msgspec.json.encode(LoadRequest("m")) == b'{"name":"m"}'
    assert msgspec.json.decode(b'{"name":"m"}', type=DemandRequest).timeout_s == 60.0
    assert msgspec.json.decode(b"{}", type=RepositoryDone).revision == 0
    assert msgspec.json.decode(b"{}", type=IndexRequest).ready is False
    assert msgspec.json.decode(b"{}", type=StatisticsRequest).quantiles == []


@pytest.mark.parametrize(
    ("data", "kind"),
    [(b'{"parameters": {}}', LoadRequest), (b'{"name": 3}', UnloadRequest), (b'{"ready": "yes"}', IndexRequest)],
)
def test_a_malformed_request_is_a_decode_error_not_a_key_error(data, kind):
    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(data, type=kind)


# -- views: a receiver that reads part of a message ------------------------------------------------

responses = st.lists(st.builds(InferResponse, st.text(max_size=8), st.text(max_size=8), st.integers(0, 9)), max_size=4)


@given(responses)
def test_the_gateways_views_read_what_the_worker_encodes(answers):
    raw = [msgspec.Raw(encode(a)) for a in answers]
    assert msgspec.msgpack.decode(encode(ResponseBatch(raw)), type=ResponseBatchView).responses == answers
    free = InstanceFree("w", "m", 1, 0, "subject", batch_id=7)
    done = msgspec.msgpack.decode(encode(BatchDone(free, raw)), type=BatchDoneView)
    assert (done.free, done.responses) == (free, answers)


@given(st.integers(0, 2**63 - 1))
def test_a_request_read_for_its_deadline(deadline):
    request = InferRequest("r", "m", 1, "inbox", deadline, inputs=[TensorRef("x", "FP32", [1], b"1234")])
    assert msgspec.msgpack.decode(encode(request), type=RequestDeadline).deadline_ns == deadline


# -- replies that were dicts -----------------------------------------------------------------------


def test_the_index_keeps_tritons_fields_and_omits_what_a_version_has_not():
    index = RepositoryIndex([IndexEntry("never_loaded"), IndexEntry("m", "1", "READY", warmup_ms=1.5, memory_bytes=0)])
    assert msgspec.to_builtins(index.models) == [
        {"name": "never_loaded"},
        {"name": "m", "version": "1", "state": "READY", "warmup_ms": 1.5, "memory_bytes": 0},
    ]
    assert msgspec.json.decode(msgspec.json.encode(index), type=RepositoryIndex) == index


def test_usage_and_figures_round_trip():
    usage = UsageReply({"a": ModelUsage(busy=True, last_used_ms=5)})
    assert msgspec.json.decode(msgspec.json.encode(usage), type=UsageReply) == usage
    assert msgspec.json.decode(b'{"models": {"b": {}}}', type=UsageReply).models["b"] == ModelUsage()
    figures = ModelFigures(
        memory=[MemoryUse("m", 1, "w", 10, 0)],
        budgets={"w": WorkerBudget(100, 2)},
        evictions=[Eviction("m", "budget", 1)],
        loads={"m": 2},
    )
    assert msgspec.json.decode(msgspec.json.encode(figures), type=ModelFigures) == figures
    assert msgspec.json.decode(b"{}", type=ModelFigures) == ModelFigures()


def test_a_reply_of_the_wrong_shape_is_a_decode_error():
    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(b'{"models": {"a": {"busy": "yes"}}}', type=UsageReply)
    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(b'[{"name": "m"}]', type=RepositoryIndex)  # the untyped list of before

"""The repository's and the statistics' requests are Structs (shared/wire/messages.py) whose JSON is
what the services sent as plain dicts before: a sender built from either is understood."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.wire.messages import (
    DemandRequest,
    IndexRequest,
    LoadRequest,
    RepositoryDone,
    StatisticsRequest,
    UnloadRequest,
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

"""services/repository/generations.py: the record a load publishes (pure logic)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.repository.generations import next_record
from services.repository.scan import ScannedModel
from shared.config import model_config as mc
from shared.errors import ShoalError
from shared.wire.records import UNLOADED, ModelRecord, ModelState, ModelVersionState

CONFIG = mc.parse_text('name: "m" backend: "onnxruntime" max_batch_size: 4')
ENSEMBLE = mc.parse_text('name: "m" platform: "ensemble"')
OLD_CONFIG = {"name": "m", "backend": "onnxruntime", "max_batch_size": 2}

states = st.sampled_from(list(ModelState))
versions = st.lists(st.integers(1, 6), unique=True, max_size=4)
previous_records = st.none() | st.builds(
    lambda vs, generation, hosted, serving: ModelRecord(
        "m",
        "/repo/m",
        OLD_CONFIG,
        {str(v): ModelVersionState(s, "" if s == ModelState.READY else "why") for v, s in vs.items()},
        generation,
        hosted,
        serving_config=serving,
    ),
    st.dictionaries(st.integers(1, 6), states, max_size=4),
    st.integers(1, 50),
    versions,
    st.sampled_from([{}, {"name": "m", "max_batch_size": 1}]),
)


def scanned(config=CONFIG, selected=(1,), error="") -> ScannedModel:
    return ScannedModel("m", Path("/repo/m"), config, list(selected), error)


@given(previous_records, versions, st.lists(st.text(max_size=3), max_size=2), st.booleans())
def test_a_good_config_loads_its_versions_while_the_ready_ones_keep_serving(previous, selected, workers, on_demand):
    before = msgspec.msgpack.encode(previous)
    record = next_record("m", scanned(selected=selected), {"OUT": ["a"]}, previous, workers, on_demand)
    assert msgspec.msgpack.encode(previous) == before  # the previous record is never edited
    assert record.generation == (previous.generation + 1 if previous else 1)
    assert record.hosted == selected and record.config == mc.to_json(CONFIG)
    assert (record.workers, record.on_demand, record.labels) == (workers, on_demand, {"OUT": ["a"]})
    assert record.reason == ("" if selected else "no version is available for model 'm'")
    old = previous.versions if previous else {}
    assert set(record.versions) == set(old) | {str(v) for v in selected}
    for key, state in record.versions.items():
        if int(key) not in selected:
            assert state == ModelVersionState(ModelState.UNAVAILABLE, UNLOADED)
        elif key in old and old[key].state == ModelState.READY:
            assert state == old[key]  # it serves until the new generation swaps in
        else:
            assert state == ModelVersionState(ModelState.LOADING)
    # the previous generation serves until the new one is ready, if it was hosted at all
    if previous is not None and previous.hosted:
        assert record.serving_config == previous.active_config and record.serving_path == "/repo/m"
    else:
        assert (record.serving_config, record.serving_path) == ({}, "")


@given(previous_records)
def test_an_ensembles_new_graph_serves_at_once(previous):
    record = next_record("m", scanned(ENSEMBLE), {}, previous, [], False)
    assert (record.serving_config, record.serving_path) == ({}, "")


@given(previous_records, versions)
def test_a_failed_config_is_refused_while_a_ready_version_serves_else_published_unavailable(previous, selected):
    failed = scanned(None, selected, "bad config")
    if previous is not None and previous.any_version(ModelState.READY):
        with pytest.raises(ShoalError) as refused:
            next_record("m", failed, {}, previous, [], False)
        assert refused.value.message == "load failed for model 'm': bad config\n"
        return
    record = next_record("m", failed, {}, previous, ["w"], True)
    assert record.reason == "bad config" and record.hosted == [] and record.config == {}
    assert record.versions == {str(v): ModelVersionState(ModelState.UNAVAILABLE, "bad config") for v in selected or [1]}
    assert record.generation == (previous.generation + 1 if previous else 1)
    assert (record.workers, record.on_demand) == (["w"], True)

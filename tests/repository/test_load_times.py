"""services/repository/service.py `load_times`: one load time per version being served, its
slowest worker's, for Triton's `nv_model_load_duration_secs`."""

from __future__ import annotations

from services.repository.service import load_times
from shared.wire.control import LoadTime
from shared.wire.records import InstanceRecord, ModelRecord, ModelState, ModelVersionState


def _report(worker: str, model: str, version: int, load_s: float, serving: int = 1) -> InstanceRecord:
    return InstanceRecord(worker, model, version, 1, ModelState.READY, serving_generation=serving, load_s=load_s)


def test_the_slowest_worker_counts_and_versions_not_served_have_none():
    reports = [
        _report("w1", "m", 1, 0.5),
        _report("w2", "m", 1, 2.0),
        _report("w1", "m", 2, 0.25),
        _report("w1", "gone", 1, 3.0, serving=0),  # unloaded, or its load failed
        _report("w1", "unloading", 1, 1.0),  # its unload answered, the worker's report still on its way
    ]
    ready = ModelVersionState(ModelState.READY)
    records = {
        "m": ModelRecord("m", versions={"1": ready, "2": ready}),
        "gone": ModelRecord("gone", versions={"1": ModelVersionState(ModelState.UNAVAILABLE)}),
        "unloading": ModelRecord("unloading", versions={"1": ModelVersionState(ModelState.UNAVAILABLE)}),
    }
    assert load_times(reports, records) == [LoadTime("m", 1, 2.0), LoadTime("m", 2, 0.25)]

"""Ensembles as the repository sees them: nested cycles, and the ensembles that name a model.
Their states: tests/repository/test_model_states.py."""

from __future__ import annotations

from services.repository.ensembles import cycle, dependents
from tests.repository.ensemble_records import ensemble, member


def test_nested_cycles_and_dependents():
    records = {"a": member("a"), "outer": ensemble("outer", ["inner", "a"]), "inner": ensemble("inner", ["a"])}
    assert sorted(dependents("a", records)) == ["inner", "outer"]
    assert dependents("inner", records) == ["outer"]
    loop = ensemble("inner", ["outer"])
    assert cycle("inner", records, loop.config) == "circular dependency between ensembles: inner -> outer -> inner"

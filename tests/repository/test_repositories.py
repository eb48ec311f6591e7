"""Several --model-repository folders: the scan, Triton's duplicate rule, namespaces, the index."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from services.repository import namespaces
from services.repository.index import index
from services.repository.repositories import DUPLICATE, Repositories
from shared.process.settings import RepositorySettings
from shared.wire.records import ModelRecord, ModelState, ModelVersionState, model_key


def folders(root: Path, layout: dict[str, list[str]]) -> list[str]:
    """Model folders (empty: the scan lists folders) in one repository per key."""
    for repository, models in layout.items():
        for model in models:
            (root / repository / model).mkdir(parents=True)
    return [str(root / repository) for repository in layout]


def test_several_repositories_are_one_set_of_models(tmp_path: Path):
    a, b = folders(tmp_path, {"a": ["alpha"], "b": ["beta", "gamma"]})
    repositories = Repositories.open([a, b], tmp_path / "mirrors")
    scan = repositories.scan()
    assert sorted(scan.models) == ["alpha", "beta", "gamma"] and scan.duplicates == []
    assert scan.models["beta"].path == Path(b) / "beta" and scan.models["beta"].namespace == ""
    assert repositories.locate("alpha") is not None and repositories.locate("alpha").path == Path(a) / "alpha"
    assert repositories.locate("missing") is None
    assert repositories.missing("missing") == "model not found in any model repository."
    assert repositories.describe() == f"{a}, {b}"


def test_a_name_in_two_repositories_is_no_model_without_namespacing(tmp_path: Path, caplog):
    a, b = folders(tmp_path, {"a": ["alpha", "shared"], "b": ["shared"]})
    repositories = Repositories.open([a, b], tmp_path / "mirrors")
    with caplog.at_level(logging.ERROR, "shoal.repository"):
        scan = repositories.scan()
        repositories.scan()  # logged once, not at every poll
    assert sorted(scan.models) == ["alpha"] and scan.duplicates == ["shared"]
    errors = [r.getMessage() for r in caplog.records]
    assert errors == ["failed to poll model 'shared': not unique across all model repositories"]
    assert repositories.named("shared") == [] and repositories.locate("shared") is None
    assert repositories.missing("shared") == "not unique across all model repositories"
    # gone from one of them: one model again, and said again if it comes back
    (Path(b) / "shared").rmdir()
    assert "shared" in repositories.scan().models
    (Path(b) / "shared").mkdir()
    caplog.clear()
    with caplog.at_level(logging.ERROR, "shoal.repository"):
        assert repositories.scan().duplicates == ["shared"]
    assert len(caplog.records) == 1


def test_with_namespacing_each_repository_is_a_namespace(tmp_path: Path):
    a, b = folders(tmp_path, {"a": ["alpha", "shared"], "b": ["shared"]})
    repositories = Repositories.open([a, b], tmp_path / "mirrors", namespacing=True)
    scan = repositories.scan()
    assert sorted(scan.models) == sorted([f"{a}::alpha", f"{a}::shared", f"{b}::shared"])
    assert scan.duplicates == []
    assert [found.key for found in repositories.named("shared")] == [f"{a}::shared", f"{b}::shared"]
    assert repositories.split(f"{b}::shared") == (b, "shared")
    assert repositories.split("shared") == ("", "shared")
    located = repositories.locate(f"{b}::shared")
    assert located is not None and located.path == Path(b) / "shared" and located.name == "shared"
    assert model_key(b, "shared") == f"{b}::shared" and model_key("", "shared") == "shared"


def test_record_knows_its_name_apart_from_its_identity():
    record = ModelRecord(model_key("/models/b", "shared"), namespace="/models/b")
    assert record.model_name == "shared"
    assert ModelRecord("plain").model_name == "plain"


def ready(name: str, namespace: str = "") -> ModelRecord:
    return ModelRecord(
        model_key(namespace, name), namespace=namespace, versions={"1": ModelVersionState(ModelState.READY)}
    )


def test_the_index_shows_a_duplicate_unavailable_even_ready_only(tmp_path: Path):
    a, b = folders(tmp_path, {"a": ["alpha", "shared"], "b": ["beta", "shared"]})
    scan = Repositories.open([a, b], tmp_path / "mirrors").scan()
    records = {"alpha": ready("alpha")}
    entries = index(records, scan, lambda key, version: []).models
    assert [(e.name, e.version, e.state, e.reason) for e in entries] == [
        ("alpha", "1", ModelState.READY, ""),
        ("beta", "", None, ""),
        ("shared", "", ModelState.UNAVAILABLE, DUPLICATE),
    ]
    ready_only = index(records, scan, lambda key, version: [], ready_only=True).models
    assert [(e.name, e.state) for e in ready_only] == [("alpha", ModelState.READY), ("shared", ModelState.UNAVAILABLE)]


def test_the_index_with_namespacing_lists_each_repositorys_model(tmp_path: Path):
    a, b = folders(tmp_path, {"a": ["shared"], "b": ["shared"]})
    scan = Repositories.open([a, b], tmp_path / "mirrors", namespacing=True).scan()
    records = {model_key(b, "shared"): ready("shared", b)}
    entries = index(records, scan, lambda key, version: []).models
    assert [(e.name, e.state) for e in entries] == [("shared", None), ("shared", ModelState.READY)]


@pytest.mark.parametrize(
    ("own", "holders", "expected", "unresolved"),
    [
        ("/a", {"m": ["/a", "/b"]}, "/a", []),  # its own repository's first
        ("/a", {"m": ["/b"]}, "/b", []),  # else the one that holds it
        ("/a", {"m": ["/b", "/c"]}, None, ["m"]),  # several others: ambiguous
        ("/a", {}, None, ["m"]),  # nowhere
    ],
)
def test_an_ensemble_step_takes_its_model_as_triton_connects_it(own, holders, expected, unresolved):
    steps = [{"model_name": "m", "model_namespace": "/stale"}]
    changed, missing = namespaces.connect(steps, own, holders)
    assert changed and missing == unresolved
    assert steps[0].get("model_namespace") == expected
    assert namespaces.connect(steps, own, holders) == (False, unresolved)  # already connected


def test_known_namespaces_count_loaded_models_outside_the_repositories(tmp_path: Path):
    a, b = folders(tmp_path, {"a": ["m"], "b": ["m"]})
    scan = Repositories.open([a, b], tmp_path / "mirrors", namespacing=True).scan()
    override = ModelRecord("x", hosted=[1])  # loaded from a load request's files: the empty namespace
    assert namespaces.known(scan, [override]) == {"m": sorted([a, b]), "x": [""]}


def test_settings_take_one_repository_or_several(monkeypatch):
    assert RepositorySettings(model_repository="/one").model_repository == ["/one"]
    assert RepositorySettings(model_repository=["/a", "/b"]).model_repository == ["/a", "/b"]
    monkeypatch.setenv("SHOAL_REPOSITORY_MODEL_REPOSITORY", "/from/env")
    assert RepositorySettings().model_repository == ["/from/env"]

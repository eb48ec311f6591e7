"""An ensemble's state follows its members in the repository's manager even when a member's report
arrives while the ensemble's previous state is being published (the manager awaits each publish)."""

from __future__ import annotations

from services.repository.manager import ModelManager
from shared.process.settings import RepositorySettings
from shared.wire.records import ModelRecord, ModelState, ModelVersionState
from tests.repository.test_ensembles import ensemble, member


async def _forget(name: str) -> None:
    pass


async def _drain(name: str, version: int) -> None:
    pass


async def test_a_member_ready_during_the_ensembles_publish_makes_it_ready(tmp_path):
    published: list[tuple[str, ModelState]] = []
    manager: ModelManager

    async def publish(record: ModelRecord) -> None:
        published.append((record.name, record.versions["1"].state))
        if published == [("pipeline", ModelState.LOADING)]:
            # the member's report comes in while this publish awaits: its refresh of the ensemble
            manager.records["segment"].versions["1"] = ModelVersionState(ModelState.READY)
            await manager.refresh("pipeline")

    settings = RepositorySettings(model_repository=str(tmp_path), model_control_mode="explicit")
    manager = ModelManager(settings, publish, _forget, _drain)
    manager.records = {
        "segment": member("segment", ModelState.LOADING),
        "pipeline": ensemble("pipeline", ["segment"]),
    }
    manager.records["pipeline"].versions["1"] = ModelVersionState(ModelState.READY)  # before the reload
    await manager.refresh("pipeline")
    assert manager.records["pipeline"].versions["1"].state == ModelState.READY
    assert published[:2] == [("pipeline", ModelState.LOADING), ("pipeline", ModelState.READY)]


async def test_nested_ensembles_naming_each_other_end_their_refreshes(tmp_path):
    settings = RepositorySettings(model_repository=str(tmp_path), model_control_mode="explicit")
    published: list[str] = []

    async def publish(record: ModelRecord) -> None:
        published.append(record.name)

    manager = ModelManager(settings, publish, _forget, _drain)
    manager.records = {"a": ensemble("a", ["b"]), "b": ensemble("b", ["a"])}
    manager.records["a"].versions["1"] = ModelVersionState(ModelState.READY)
    await manager.refresh("a")
    assert len(published) <= 4

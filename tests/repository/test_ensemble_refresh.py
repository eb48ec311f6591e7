"""An ensemble's state follows its members even when a member changes while the ensemble's own
refresh is publishing (a worker's report arrives during the await): the refresh asked for
meanwhile runs once that one is done, instead of being dropped (the ensemble stayed LOADING)."""

from __future__ import annotations

from services.repository.manager import ModelManager
from shared.process.settings import RepositorySettings
from shared.wire.records import ModelRecord, ModelState, ModelVersionState
from tests.scheduler.ensembles.test_runner import MEMBER, io, record

ENSEMBLE = {
    "platform": "ensemble",
    "max_batch_size": 8,
    "input": [io("RAW")],
    "output": [io("OUT")],
    "ensemble_scheduling": {
        "step": [{"model_name": "m", "model_version": -1, "input_map": {"X": "RAW"}, "output_map": {"Y": "OUT"}}]
    },
}


async def _nothing(*args: object) -> None:
    pass


async def test_a_member_ready_during_the_ensembles_publish_makes_it_ready(tmp_path):
    published: list[tuple[str, ModelState]] = []
    manager: ModelManager

    async def publish(model: ModelRecord) -> None:
        published.append((model.name, model.versions["1"].state))
        if model.name == "ens" and len(published) == 1:  # the member's report, mid-publish
            manager.records["m"].versions["1"] = ModelVersionState(ModelState.READY)
            await manager.refresh("ens")

    settings = RepositorySettings(model_repository=str(tmp_path), model_control_mode="explicit")
    manager = ModelManager(settings, publish, _nothing, _nothing)
    member = record("m", MEMBER)
    member.versions["1"] = ModelVersionState(ModelState.LOADING)
    manager.records = {"m": member, "ens": record("ens", ENSEMBLE)}
    await manager.refresh("ens")
    assert published == [("ens", ModelState.LOADING), ("ens", ModelState.READY)]
    assert manager.records["ens"].versions["1"].state == ModelState.READY

"""The ensemble runner's view of the models catching up with the bucket (against a real nats-server):
a step for a member that looks unloaded waits for the view to reach the bucket's newest revision."""

from __future__ import annotations

import time

from services.scheduler.ensembles.ensemble_runner import CATCH_UP_S, EnsembleRunner
from shared.bus import buckets, connection
from shared.wire import subjects
from shared.wire.messages import encode
from shared.wire.records import ModelState, ModelVersionState
from tests.scheduler.ensembles.test_ensemble_runner import MEMBER, PIPELINE, record


async def test_a_view_behind_the_bucket_waits_for_it_and_a_current_one_does_not(nats_server):
    nc = await connection.connect(nats_server.url, "test-catch-up")
    try:
        kv = await buckets.bucket(nc, subjects.MODELS_BUCKET)
        runner = EnsembleRunner(nc, "catch-up")
        await runner.start(kv)
        for name, config in (("pre", MEMBER), ("cls", MEMBER), ("seg", MEMBER), ("pipeline", PIPELINE)):
            entry = record(name, config)
            if name == "seg":
                entry.versions = {"1": ModelVersionState(ModelState.LOADING)}
            runner.on_record(name, entry, await buckets.put(kv, subjects.model_key(name), encode(entry)))
        ready = record("seg", MEMBER)
        newest = await buckets.put(kv, subjects.model_key("seg"), encode(ready))  # this view has not seen it
        started = time.monotonic()
        await runner._catch_up("pipeline")  # nothing applies the newest record: it waits, then gives up
        assert time.monotonic() - started >= CATCH_UP_S * 0.9 and runner.revisions.latest < newest
        runner.on_record("seg", ready, newest)  # the watch brings it
        assert runner._servable("pipeline") and runner.revisions.latest == newest
        started = time.monotonic()
        await runner._catch_up("pipeline")  # servable: no bucket round trip, no wait
        assert time.monotonic() - started < CATCH_UP_S
    finally:
        await nc.close()

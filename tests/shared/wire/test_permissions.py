"""The permission table's rules, checked with NATS's own matching (a token per `.`, `*` one token,
`>` the rest; deny beats allow) over generated subjects. nats-server enforces the table:
tests/shoal/test_serve_security.py shows it refusing what these say is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.wire import permissions as p
from shared.wire import subjects

names = st.text(min_size=1, max_size=20)  # model and worker names: any text, tokenised as Shoal does
SERVICES_BUT_REPOSITORY = [p.GATEWAY, p.SCHEDULER, p.WORKER, p.INSTANCE, p.OPERATOR]


def matches(pattern: str, subject: str) -> bool:
    want, got = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or (token != "*" and token != got[i]):
            return False
    return len(want) == len(got)


def may_publish(kind: str, subject: str) -> bool:
    rights = p.for_kind(kind)
    allowed = any(matches(a, subject) for a in rights.publish)
    return allowed and not any(matches(d, subject) for d in rights.publish_deny)


def may_subscribe(kind: str, subject: str) -> bool:
    rights = p.for_kind(kind)
    allowed = any(matches(a, subject) for a in rights.subscribe)
    return allowed and not any(matches(d, subject) for d in rights.subscribe_deny)


def test_the_matcher_is_natss():
    assert matches("a.*.c", "a.b.c") and not matches("a.*.c", "a.b.d") and not matches("a.*", "a.b.c")
    assert matches("a.>", "a.b.c") and not matches("a.>", "a") and matches(">", "x")


@given(names)
def test_only_the_repository_writes_model_state_and_files(model):
    key = subjects.model_key(model)
    writes = [f"$KV.{subjects.MODELS_BUCKET}.{key}", f"$O.{subjects.MODEL_FILES_BUCKET}.C.{key}"]
    writes += [f"$JS.API.STREAM.{verb}.KV_{subjects.MODELS_BUCKET}" for verb in ("CREATE", "PURGE", "DELETE")]
    writes += [f"$JS.API.STREAM.MSG.DELETE.OBJ_{subjects.MODEL_FILES_BUCKET}"]
    for subject in writes:
        assert may_publish(p.REPOSITORY, subject)
        assert not any(may_publish(kind, subject) for kind in SERVICES_BUT_REPOSITORY), subject


@given(names)
def test_only_the_repository_announces_and_answers_as_the_repository(worker):
    for subject in (subjects.worker_report(subjects.token(worker)), subjects.SCHEDULER_DRAIN, subjects.SCHEDULER_USAGE):
        assert may_publish(p.REPOSITORY, subject)
        assert not any(may_publish(kind, subject) for kind in SERVICES_BUT_REPOSITORY), subject
    for subject in p.REPOSITORY_REQUESTS:
        assert may_subscribe(p.REPOSITORY, subject)
        assert not any(may_subscribe(kind, subject) for kind in SERVICES_BUT_REPOSITORY), subject


@given(names, names)
def test_each_kind_may_do_its_job(model, worker):
    worker_id = subjects.token(worker)
    inbox = subjects.gateway_inbox(subjects.token(worker))
    jobs = {
        p.GATEWAY: [subjects.infer(model), f"{inbox}.1", subjects.REPOSITORY_LOAD, f"$KV.{subjects.SHM_BUCKET}.x"],
        p.SCHEDULER: [
            subjects.worker_exec(worker_id),
            subjects.worker_sequence(worker_id),
            f"$KV.{subjects.LEASES_BUCKET}.m",
        ],
        p.WORKER: [
            subjects.response_batch(inbox),
            subjects.batch_done(inbox),
            subjects.INSTANCE_FREE,
            subjects.scheduler_alive(worker, "1a2b3c4d"),  # asking whether the holder of its BLS requests lives
        ],
        p.INSTANCE: [
            subjects.infer(model),
            subjects.WORKER_HEARTBEAT,
            f"$KV.{subjects.INSTANCES_BUCKET}.{worker_id}",
            subjects.scheduler_alive(worker, "1a2b3c4d"),
        ],
        p.OPERATOR: ["$SRV.INFO", subjects.SCHEDULER_STATS, f"$JS.API.DIRECT.GET.KV_{subjects.MODELS_BUCKET}"],
    }
    for kind, needed in jobs.items():
        for subject in needed:
            assert may_publish(kind, subject), (kind, subject)
    assert may_subscribe(p.SCHEDULER, subjects.infer(model)) and may_subscribe(
        p.WORKER, subjects.worker_exec(worker_id)
    )


@given(names)
def test_a_worker_cannot_take_requests_meant_for_a_scheduler(model):
    for kind in (p.WORKER, p.INSTANCE, p.OPERATOR):
        assert not may_subscribe(kind, subjects.infer(model))


@given(names)
def test_the_operator_writes_nothing_and_reads_no_tensors(model):
    for subject in (subjects.infer(model), subjects.LOGGING, f"$KV.{subjects.SHM_BUCKET}.x", "$JS.API.STREAM.DELETE.x"):
        assert not may_publish(p.OPERATOR, subject)
    assert not may_subscribe(p.OPERATOR, f"{subjects.gateway_inbox('g')}.1")


def test_an_unknown_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="no NATS identity kind 'root'"):
        p.for_kind("root")

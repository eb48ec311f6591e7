"""SequenceBook: slot assignment, backlog hand-over, idle timeouts, lost workers (pure logic)."""

from __future__ import annotations

from dataclasses import dataclass

from services.scheduler.sequences.book import SequenceBook
from services.scheduler.sequences.selection import decide
from shared.config.sequence_config import SequenceConfig


@dataclass
class Req:
    name: str
    arrived: float = 0.0
    shape_sig: str = ""
    batch_size: int = 1


def book(slots: int = 1, idle_s: float = 1.0, instances=(("w1", 0),)) -> SequenceBook:
    b = SequenceBook("m", slots, idle_s)
    for worker, instance in instances:
        b.learn(worker, instance, 0.0)
    return b


def test_unknown_sequence_without_start_is_refused_with_tritons_text():
    b = book()
    admission = b.admit(7, False, False, Req("a"), 0.0)
    assert admission.sequence is None
    assert admission.error == (
        "inference request for sequence 7 to model 'm' must specify the START flag on the first request of the sequence"
    )


def test_sequences_spread_over_instances_and_keep_their_slot():
    b = book(slots=2, instances=(("w1", 0), ("w2", 0)))
    s1 = b.admit(1, True, False, Req("a"), 0.0).sequence
    s2 = b.admit(2, True, False, Req("b"), 0.0).sequence
    assert s1.instance != s2.instance  # the least loaded instance first
    again = b.admit(1, False, False, Req("c"), 0.1).sequence
    assert again is s1 and list(r.name for r in s1.queue) == ["a", "c"]


def test_backlog_takes_the_slot_of_the_next_ending_sequence_with_its_queue():
    b = book(slots=1)
    s1 = b.admit(1, True, False, Req("a1"), 0.0).sequence
    s2 = b.admit(2, True, False, Req("b1"), 0.0).sequence
    b.admit(2, False, False, Req("b2"), 0.0)
    assert s2.slot is None and list(b.backlog) == [s2]
    b.started(s1, s1.queue[0], 0.0)
    b.finished(s1, 0.1)
    b.admit(1, False, True, Req("a2"), 0.2)  # END: the id is forgotten at once
    assert 1 not in b.live
    b.started(s1, s1.queue[0], 0.2)
    b.finished(s1, 0.3)
    assert s2.slot == ("w1", 0, 0) and [r.name for r in s2.queue] == ["b1", "b2"] and s2.active_at == 0.3
    assert b.ready("w1", 0) == [s2]


def test_second_start_continues_in_the_same_slot():
    b = book()
    s1 = b.admit(1, True, False, Req("a"), 0.0).sequence
    admission = b.admit(1, True, False, Req("b"), 0.0)
    assert admission.conflict and admission.sequence is s1


def test_idle_sequence_frees_its_slot_and_hands_back_queued_requests():
    b = book(slots=1, idle_s=0.5)
    s1 = b.admit(1, True, False, Req("a"), 0.0).sequence
    b.started(s1, s1.queue[0], 0.0)
    assert b.idle(10.0) == []  # never while a request executes
    b.finished(s1, 1.0)
    b.admit(1, False, False, Req("late"), 1.2)
    assert b.next_idle_at() == 1.7
    expired = b.idle(1.7)
    assert [(s, slot) for s, slot in expired] == [(s1, ("w1", 0, 0))]
    assert [r.name for r in s1.queue] == ["late"]  # for the caller to fail
    assert 1 not in b.live and b.free == [("w1", 0, 0)]
    assert b.admit(1, False, False, Req("x"), 2.0).sequence is None


def test_cancelled_end_still_ends_the_sequence_and_release_is_idempotent():
    b = book(slots=1)
    s1 = b.admit(1, True, False, Req("a"), 0.0).sequence
    end = Req("end")
    b.admit(1, False, True, end, 0.0)
    b.started(s1, s1.queue[0], 0.0)
    b.remove(s1, end, 0.1)  # the END was cancelled while the START ran
    assert s1.slot is not None
    b.finished(s1, 0.2)
    assert s1.slot is None and b.free == [("w1", 0, 0)]
    b._release(s1, 0.3)  # a second release must not free the slot twice
    assert b.free == [("w1", 0, 0)]


def test_lost_worker_loses_its_sequences_with_a_clear_reason():
    b = book(slots=1, instances=(("w1", 0), ("w2", 0)))
    s1 = b.admit(1, True, False, Req("a"), 0.0).sequence
    worker = s1.slot[0]
    assert b.forget_worker(worker, "worker gone") == [s1]
    error = b.admit(1, False, False, Req("b"), 0.1).error
    assert "was lost: worker gone" in error
    assert all(slot[0] != worker for slot in b.free)


def test_backlog_before_any_instance_is_known():
    b = SequenceBook("m", 2, 1.0)
    s1 = b.admit(1, True, False, Req("a"), 0.0).sequence
    assert s1.slot is None
    b.learn("w1", 0, 5.0)
    assert s1.slot == ("w1", 0, 0) and s1.active_at == 5.0


def _ready(b: SequenceBook, count: int, now: float = 0.0):
    seqs = [b.admit(i, True, False, Req(str(i), arrived=now), now).sequence for i in range(1, count + 1)]
    return seqs


def test_direct_batches_every_ready_slot_or_waits_for_utilization():
    config = SequenceConfig("direct", 4, 1_000_000)
    b = book(slots=4)
    seqs = _ready(b, 3)
    assert decide(config, b.ready("w1", 0), 0.0).take == seqs
    waiting = SequenceConfig("direct", 4, 1_000_000, max_queue_delay_us=10_000, minimum_slot_utilization=1.0)
    decision = decide(waiting, b.ready("w1", 0), 0.0)
    assert decision.take == [] and decision.wake_at == 0.01
    assert decide(waiting, b.ready("w1", 0), 0.02).take == seqs


def test_oldest_uses_preferred_sizes_and_delay():
    config = SequenceConfig(
        "oldest", 4, 1_000_000, max_queue_delay_us=10_000, max_candidate_sequences=4, preferred_batch_sizes=(2, 4)
    )
    b = book(slots=4)
    _ready(b, 3)
    decision = decide(config, b.ready("w1", 0), 0.0)
    assert len(decision.take) == 2 and decision.reason == "preferred batch size"
    assert len(decide(config, b.ready("w1", 0), 0.02).take) == 3


def test_a_one_request_sequence_is_never_live():
    b = book(slots=1)
    s1 = b.admit(1, True, True, Req("only"), 0.0).sequence
    assert 1 not in b.live and s1.closing
    b.started(s1, s1.queue[0], 0.0)
    b.finished(s1, 0.1)
    assert b.free == [("w1", 0, 0)]


def test_request_timeout_rejects_a_backlogged_sequence_only():
    b = book(slots=1)
    b.admit(1, True, False, Req("a"), 0.0)
    waiting = b.admit(2, True, False, Req("b"), 0.0).sequence
    b.admit(2, False, False, Req("late"), 0.0)
    assert b.expire_backlog(lambda item: item.name == "b") == [waiting]
    assert not b.backlog and 2 not in b.live and [r.name for r in waiting.queue] == ["b", "late"]


def test_requests_past_their_deadline_leave_the_backlog():
    b = book(slots=1)
    live = b.admit(1, True, False, Req("live"), 0.0).sequence
    dead = [b.admit(100 + i, True, False, Req(f"dead{i}"), 0.1).sequence for i in range(3)]
    assert len(b.backlog) == 3
    gone = b.expire(lambda item: item.name.startswith("dead"), 0.2)
    assert [item.name for _, item, _ in gone] == ["dead0", "dead1", "dead2"]
    assert not b.backlog and set(b.live) == {1} and all(s.slot is None for s in dead)
    b.started(live, live.queue[0], 0.3)
    b.admit(1, False, True, Req("end"), 0.4)
    b.finished(live, 0.5)
    b.started(live, live.queue[0], 0.5)
    b.finished(live, 0.6)
    assert b.free == [("w1", 0, 0)]  # the slot went back to the pool, not to a dead sequence


def test_a_start_that_expires_before_it_ran_frees_its_slot():
    b = book(slots=1)
    start = Req("start")
    seq = b.admit(1, True, False, start, 0.0).sequence
    waiting = b.admit(2, True, False, Req("next"), 0.1).sequence  # backlogged behind it
    ((_, item, slot),) = b.expire(lambda item: item is start, 0.2)
    assert item is start and slot == ("w1", 0, 0) and seq.slot is None and 1 not in b.live
    assert waiting.slot == ("w1", 0, 0)  # the slot went to the backlog at once

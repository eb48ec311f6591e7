"""Live sequences across a scheduler hand-over: frozen and reserved slots, and where a request goes (pure logic)."""

from __future__ import annotations

from services.scheduler.replicas.handover import Seen, busy, route
from services.scheduler.sequences.book import SequenceBook
from shared.wire.messages import RequestHeader, SequenceResidue
from tests.scheduler.sequences.test_book import Req

INSTANCES = (("w1", 0), ("w2", 0))


def book(slots: int = 2) -> SequenceBook:
    b = SequenceBook("m", slots, 1.0)
    for worker, instance in INSTANCES:
        b.learn(worker, instance, 0.0)
    return b


def run(b: SequenceBook, seq, now: float) -> None:
    b.started(seq, seq.queue[0], now)
    b.finished(seq, now)


def test_a_frozen_book_keeps_its_sequences_slots_and_binds_no_other():
    old = book()
    s1 = old.admit(1, True, False, Req("a"), 0.0).sequence
    s2 = old.admit(2, True, False, Req("b"), 0.0).sequence
    old.freeze()
    assert old.free == [] and old.held_slots() == sorted([s1.slot, s2.slot])
    old.learn("w3", 0, 0.1)  # a new instance's slots are the new owner's
    assert old.free == []
    old.admit(1, False, True, Req("a-end"), 0.2)
    run(old, s1, 0.2)
    run(old, s1, 0.3)  # END ran: the slot is given away, not freed here
    assert s1.slot is None and old.free == [] and old.held_slots() == [s2.slot]
    assert busy(old)
    old.admit(2, False, True, Req("b-end"), 0.4)
    run(old, s2, 0.4)
    run(old, s2, 0.5)
    assert not busy(old)


def test_a_frozen_book_gives_its_own_freed_slot_to_its_backlog():
    old = book(slots=1)
    s1 = old.admit(1, True, False, Req("a"), 0.0).sequence
    old.admit(2, True, False, Req("b"), 0.0)
    s3 = old.admit(3, True, False, Req("c"), 0.0).sequence  # both slots taken: backlog
    assert s3.slot is None
    old.freeze()
    old.admit(1, False, True, Req("a-end"), 0.1)
    run(old, s1, 0.1)
    run(old, s1, 0.2)
    assert s3.slot is not None and old.free == []


def test_reserved_slots_are_never_bound_until_given_back():
    new = book()
    held = {("w1", 0, 0), ("w1", 0, 1), ("w2", 0, 0)}
    assert new.reserve(held, 0.0) == []
    assert new.free == [("w2", 0, 1)]
    s1 = new.admit(10, True, False, Req("x"), 0.0).sequence
    s2 = new.admit(11, True, False, Req("y"), 0.0).sequence
    assert s1.slot == ("w2", 0, 1) and s2.slot is None  # the rest wait for a slot of their own
    new.learn("w1", 0, 0.1)  # known already: nothing freed again
    assert new.free == []
    new.reserve({("w1", 0, 0), ("w1", 0, 1)}, 0.2)  # the old owner's sequence on w2 ended
    assert s2.slot == ("w2", 0, 0) and s2.active_at == 0.2
    new.reserve(set(), 0.3)
    assert sorted(new.free) == [("w1", 0, 0), ("w1", 0, 1)]


def test_lost_ids_are_told_why():
    new = book()
    new.admit(5, True, False, Req("live"), 0.0)
    new.lose([4, 5], "scheduler s1 stopped responding")
    assert new.admit(4, False, False, Req("a"), 0.1).error == (
        "sequence 4 to model 'm' was lost: scheduler s1 stopped responding; start it again with the START flag"
    )
    assert new.admit(5, False, False, Req("b"), 0.1).sequence is not None  # live here: not lost
    assert new.admit(4, True, False, Req("c"), 0.2).sequence is not None and 4 not in new.lost


def test_sequence_numbers_of_two_books_do_not_collide():
    first, second = book(), book()
    assert (
        first.admit(1, True, False, Req("a"), 0.0).sequence.seq
        != second.admit(1, True, False, Req("b"), 0.0).sequence.seq
    )


def header(corrid, start: bool = False) -> RequestHeader:
    return RequestHeader(
        rid="r", model="m", version=1, reply="x", deadline_ns=0, sequence_id=corrid, sequence_start=start
    )


def seen(holder: str, final: bool, ids=()) -> Seen:
    residue = SequenceResidue(model="m", version=1, holder=holder, final=final, ids=list(ids))
    return Seen(residue=residue, ids=set(ids))


def test_during_the_overlap_the_old_owner_takes_every_request():
    holders = {"old": seen("old", final=False)}
    assert route(holders, set(), header(7)) == "old"
    assert route(holders, set(), header(8, start=True)) == "old"
    assert route(holders, {9}, header(9)) is None  # a sequence of ours (the model came back to us) stays


def test_a_book_thawed_when_the_model_comes_back_frees_what_it_gave_away():
    b = book()
    s1 = b.admit(1, True, False, Req("a"), 0.0).sequence
    b.freeze()
    b.reserve({("w2", 0, 0)}, 0.1)  # the other replica's sequence since
    b.thaw(0.2)
    assert sorted(b.free) == sorted({("w1", 0, 0), ("w1", 0, 1), ("w2", 0, 1)} - {s1.slot})
    assert not b.frozen and s1.slot in b.bound


def test_after_the_overlap_only_the_residues_ids_go_to_their_holder():
    holders = {"a": seen("a", True, [1, "s"]), "b": seen("b", True, [2])}
    assert route(holders, set(), header(1)) == "a"
    assert route(holders, set(), header("s")) == "a"
    assert route(holders, set(), header(2, start=True)) == "b"  # a restart goes on in its slot there
    assert route(holders, set(), header(3, start=True)) is None  # new sequences are the owner's
    assert route(holders, set(), header(3)) is None  # unknown everywhere: Triton's error here
    assert route(holders, {1}, header(1)) is None  # restarted here since (a bounced START)
    assert route({}, set(), header(1)) is None

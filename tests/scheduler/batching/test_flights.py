"""services/scheduler/batching/flights.py: what each instance runs and what waits behind it, a
flight ending once, overdue flights, and which flights a reconnected worker's holdings can judge
(its own, dispatched before the cutoff, in sending order: credits.py, `lost_in_transit`)."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from services.scheduler.batching.flights import Flights
from services.scheduler.scheduling_records import InFlight, Key, Pending, Slot
from shared.wire.messages import RequestHeader


def flight(worker: str, dispatched: float) -> InFlight:
    return InFlight(("m", 1), Slot(worker, 0, 0, f"shoal.worker.{worker}.exec"), [], dispatched)


def test_only_the_workers_flights_sent_before_the_cutoff_in_sending_order():
    flights = Flights()
    flights.start(7, flight("a", 1.0))
    flights.start(3, flight("a", 0.5))
    flights.start(9, flight("a", 5.0))  # after the cutoff: may not be in the holdings yet
    flights.start(4, flight("b", 0.1))  # another worker's
    assert flights.sent_before("a", 2.0) == [("a", 3), ("a", 7)]


@given(st.dictionaries(st.integers(0, 10**6), st.tuples(st.sampled_from("ab"), st.floats(0, 10))), st.floats(0, 10))
def test_sent_before_is_exactly_the_workers_earlier_flights(table, cutoff):
    flights = Flights()
    for batch_id, (worker, dispatched) in table.items():
        flights.start(batch_id, flight(worker, dispatched))
    found = flights.sent_before("a", cutoff)
    assert found == sorted((("a", b) for b, (w, d) in table.items() if w == "a" and d < cutoff), key=lambda k: k[1])


def request(rid: str, deadline_ns: int = 0) -> Pending:
    return Pending(RequestHeader(rid, "m", 1, "inbox", deadline_ns), msgspec.Raw(b""), 0.0)


def on_instance(instance: int, rids: list[str], key: Key = ("m", 1), deadline_ns: int = 0) -> InFlight:
    slot = Slot("w", instance, 0, "shoal.worker.w.exec")
    return InFlight(key, slot, [request(r, deadline_ns) for r in rids], 0.0)


def test_a_flight_ends_once_and_gives_its_resources_back_once():
    flights = Flights()
    sent = on_instance(0, ["r1"])
    flights.start(5, sent)
    assert flights.busy(("m", 1), sent.slot) and flights.holds(sent.slot) and flights.count(("m", 1)) == 1
    assert flights.mine("w", 5, ("m", 1)) and not flights.mine("w", 5, ("m", 2)) and not flights.mine("x", 5, ("m", 1))
    assert flights.end(("w", 5)) is sent
    assert flights.end(("w", 5)) is None  # a second completion of the same batch: nothing returns twice
    assert not flights.busy(("m", 1), sent.slot) and not flights.holds(sent.slot) and flights.count(("m", 1)) == 0


def test_batch_ids_are_new_each_time():
    flights = Flights()
    ids = [flights.next_id() for _ in range(100)]
    assert len(set(ids)) == 100 and ids == sorted(ids)


def test_batches_sent_ahead_wait_behind_the_first_on_their_instance():
    flights = Flights()
    running, ahead, other = on_instance(0, ["a"]), on_instance(0, ["b", "c"]), on_instance(1, ["d"])
    flights.start(10, running)
    flights.start(11, ahead)
    flights.start(12, other)  # alone on its instance: running, not waiting
    flights.start(13, on_instance(0, ["x"], key=("n", 1)))  # another model's
    assert flights.waiting(("m", 1)) == [ahead]
    assert flights.waiting_requests(("m", 1)) == 2
    ahead.cancelled.add("b")  # answered already: no longer pending
    assert flights.waiting_requests(("m", 1)) == 1
    flights.end(("w", 10))
    assert flights.waiting(("m", 1)) == [] and flights.waiting_requests(("m", 1)) == 0


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4)), max_size=20))
def test_every_instance_runs_its_oldest_batch_and_the_rest_wait(sent):
    flights = Flights()
    for batch_id, (instance, size) in enumerate(sent):
        flights.start(batch_id, on_instance(instance, [f"{batch_id}.{i}" for i in range(size)]))
    instances = {instance for instance, _ in sent}
    assert len(flights.waiting(("m", 1))) == len(sent) - len(instances)
    first = {instance: sizes for instance, sizes in reversed(sent)}  # the oldest batch of each instance
    assert flights.waiting_requests(("m", 1)) == sum(s for _, s in sent) - sum(first.values())


def test_overdue_flights_are_those_whose_every_request_is_past_its_deadline():
    flights = Flights()
    flights.start(1, on_instance(0, ["a", "b"], deadline_ns=100))
    late = on_instance(1, ["c"], deadline_ns=100)
    late.requests.append(request("d", deadline_ns=300))  # one request still has time
    flights.start(2, late)
    assert flights.overdue(200) == [("w", 1)]
    assert flights.overdue(400) == [("w", 1), ("w", 2)]


def test_an_instance_holding_a_batch_sent_over_nats_keeps_the_next_one_there():
    flights = Flights()
    key: Key = ("m", 1)
    by_bus = on_instance(0, ["r1"], key)
    flights.start(1, by_bus)
    assert flights.sent_over_bus(key, by_bus.slot)  # a batch on the channel now could overtake it
    assert not flights.sent_over_bus(key, Slot("w", 1, 0, "shoal.worker.w.exec"))  # another instance
    on_channel = on_instance(0, ["r2"], key)
    on_channel.over_bus = False
    flights.start(2, on_channel)
    flights.end(("w", 1))
    assert not flights.sent_over_bus(key, by_bus.slot)  # only the channel's batch left: the channel again
    flights.end(("w", 2))
    assert not flights.sent_over_bus(key, by_bus.slot) and not flights.busy(key, by_bus.slot)

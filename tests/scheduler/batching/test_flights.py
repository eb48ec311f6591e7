"""Which flights a reconnected worker's holdings can judge: its own, dispatched before the cutoff,
in sending order (services/scheduler/batching/credits.py, `lost_in_transit`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.scheduler.batching.flights import Flights
from services.scheduler.batching.model_queue import InFlight, Slot


def flight(worker: str, dispatched: float) -> InFlight:
    return InFlight(("m", 1), Slot(worker, 0, 0, f"shoal.worker.{worker}.exec"), [], dispatched)


def test_only_the_workers_flights_sent_before_the_cutoff_in_sending_order():
    flights = Flights(lambda _: None)
    flights.start(7, flight("a", 1.0))
    flights.start(3, flight("a", 0.5))
    flights.start(9, flight("a", 5.0))  # after the cutoff: may not be in the holdings yet
    flights.start(4, flight("b", 0.1))  # another worker's
    assert flights.sent_before("a", 2.0) == [("a", 3), ("a", 7)]


@given(st.dictionaries(st.integers(0, 10**6), st.tuples(st.sampled_from("ab"), st.floats(0, 10))), st.floats(0, 10))
def test_sent_before_is_exactly_the_workers_earlier_flights(table, cutoff):
    flights = Flights(lambda _: None)
    for batch_id, (worker, dispatched) in table.items():
        flights.start(batch_id, flight(worker, dispatched))
    found = flights.sent_before("a", cutoff)
    assert found == sorted((("a", b) for b, (w, d) in table.items() if w == "a" and d < cutoff), key=lambda k: k[1])

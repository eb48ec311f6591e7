"""The batches this replica sent and has not heard back about, and what each instance runs."""

from __future__ import annotations

import secrets
from collections import Counter

from services.scheduler.scheduling_records import InFlight, Key, Slot

FlightKey = tuple[str, int]  # (worker, batch id)
Instance = tuple[str, Key, int]  # (worker, model version, instance index): indices are per model


def _instance(flight: InFlight) -> Instance:
    return (flight.slot.worker, flight.key, flight.slot.instance)


class Flights:
    def __init__(self) -> None:
        self.table: dict[FlightKey, InFlight] = {}
        self.running: Counter[Instance] = Counter()  # batches in flight per instance
        self.on_bus: Counter[Instance] = Counter()  # of those, sent over NATS (`over_bus`)
        # every replica hears every completion: batch ids must not collide across replicas
        self._batch_ids = secrets.randbits(40)

    def next_id(self) -> int:
        self._batch_ids += 1
        return self._batch_ids

    def start(self, batch_id: int, flight: InFlight) -> None:
        self.table[(flight.slot.worker, batch_id)] = flight
        self.running[_instance(flight)] += 1
        if flight.over_bus:
            self.on_bus[_instance(flight)] += 1

    def mine(self, worker: str, batch_id: int, key: Key) -> bool:
        """Whether a completion is of a batch this replica sent (every replica hears them all)."""
        flight = self.table.get((worker, batch_id))
        return flight is not None and flight.key == key

    def end(self, flight_key: FlightKey) -> InFlight | None:
        """The flight, no longer in the table (None if it ended already): its resources are the
        caller's to return (`credits.Credits`)."""
        flight = self.table.pop(flight_key, None)
        if flight is not None:
            self.running[_instance(flight)] -= 1
            if flight.over_bus:
                self.on_bus[_instance(flight)] -= 1
        return flight

    def holds(self, slot: Slot) -> bool:
        """Whether the credit is taken by a batch in flight."""
        return any(f.slot == slot for f in self.table.values())

    def busy(self, key: Key, slot: Slot) -> bool:
        """Whether the slot's instance runs a batch (of this replica) now."""
        return self.running[(slot.worker, key, slot.instance)] > 0

    def sent_over_bus(self, key: Key, slot: Slot) -> bool:
        """Whether the slot's instance holds a batch sent over NATS: the next one takes NATS too,
        since a batch on the local channel could overtake it (the instance runs batches in the order
        they reach it, and a decoupled ensemble's iterations must reach their client in order)."""
        return self.on_bus[(slot.worker, key, slot.instance)] > 0

    def count(self, key: Key) -> int:
        return sum(1 for f in self.table.values() if f.key == key)

    def instances_busy(self, key: Key) -> set[tuple[str, int]]:
        """The (worker, instance) pairs that hold a batch of the model version (running or sent ahead)."""
        return {(f.slot.worker, f.slot.instance) for f in self.table.values() if f.key == key}

    def waiting(self, key: Key) -> list[InFlight]:
        """The model version's batches sent ahead that wait at their instance behind another one
        (an instance runs one batch at a time, in the order they were sent)."""
        first: dict[Instance, int] = {}
        for (_, batch_id), flight in self.table.items():
            if flight.key == key:
                first[_instance(flight)] = min(batch_id, first.get(_instance(flight), batch_id))
        return [
            flight
            for (_, batch_id), flight in self.table.items()
            if flight.key == key and batch_id != first[_instance(flight)]
        ]

    def waiting_requests(self, key: Key) -> int:
        """Requests sent ahead and not started yet: still pending, as Triton counts them."""
        return sum(len(f.requests) - len(f.cancelled) for f in self.waiting(key)) if self.table else 0

    def of_worker(self, worker: str) -> list[FlightKey]:
        return [k for k in self.table if k[0] == worker]

    def sent_before(self, worker: str, cutoff: float) -> list[FlightKey]:
        """The worker's flights dispatched before `cutoff` (time.monotonic()), in sending order."""
        return sorted(
            (k for k, f in self.table.items() if k[0] == worker and f.dispatched < cutoff), key=lambda k: k[1]
        )

    def overdue(self, cutoff_ns: int) -> list[FlightKey]:
        """Flights whose every request's deadline passed before `cutoff_ns`."""
        return [k for k, f in self.table.items() if max(p.header.deadline_ns for p in f.requests) < cutoff_ns]

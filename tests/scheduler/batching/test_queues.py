"""services/scheduler/batching/queues.py: serving order across priority levels, queue timeouts,
and the expiry watermark that lets the scheduler skip the scan for expired requests."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from services.scheduler.batching.queues import Priorities, QueuePolicy, RequestQueue, TimeoutAction


@dataclass
class Item:
    name: str
    level: int
    deadline_ns: int
    queue_deadline_ns: int = 0

    @property
    def expires_ns(self) -> int:
        return min(self.deadline_ns, self.queue_deadline_ns) if self.queue_deadline_ns else self.deadline_ns


def test_levels_are_served_highest_first_and_fifo_within_a_level():
    queue: RequestQueue[Item] = RequestQueue()
    for name, level in (("a", 2), ("b", 1), ("c", 2), ("d", 1)):
        queue.append(Item(name, level, 10**12))
    assert [i.name for i in queue] == ["b", "d", "a", "c"]
    assert queue[0].name == "b" and queue.popleft().name == "b" and len(queue) == 3


def test_delay_moves_a_timed_out_request_behind_its_level_and_reject_returns_it():
    priorities = Priorities(levels=2, policies={1: QueuePolicy(timeout_action=TimeoutAction.DELAY)})
    queue: RequestQueue[Item] = RequestQueue()
    queue.append(Item("late", 1, 10**12, queue_deadline_ns=100))
    queue.append(Item("on-time", 1, 10**12))
    queue.append(Item("rejected", 2, 10**12, queue_deadline_ns=100))
    assert queue.due(100) and not queue.due(99)
    assert [i.name for i in queue.time_out(100, priorities)] == ["rejected"]
    assert [i.name for i in queue] == ["on-time", "late"]
    assert not queue.due(10**12 - 1)  # the delayed request keeps only its deadline


operation = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 3), st.integers(1, 1000), st.integers(0, 1000)),
    st.tuples(st.just("appendleft"), st.integers(1, 3), st.integers(1, 1000), st.integers(0, 1000)),
    st.tuples(st.just("popleft")),
    st.tuples(st.just("remove"), st.integers(0, 1000)),
    st.tuples(st.just("time_out"), st.integers(0, 1000)),
)


@given(st.lists(operation, max_size=40))
def test_the_watermark_never_hides_an_expired_request(operations):
    priorities = Priorities(levels=3, policies={2: QueuePolicy(timeout_action=TimeoutAction.DELAY)})
    queue: RequestQueue[Item] = RequestQueue()
    for n, (kind, *args) in enumerate(operations):
        if kind in ("append", "appendleft"):
            level, deadline, queue_deadline = args
            getattr(queue, kind)(Item(str(n), level, deadline, queue_deadline))
        elif kind == "popleft" and queue:
            queue.popleft()
        elif kind == "remove":
            queue.remove(lambda i, now=args[0]: i.deadline_ns <= now)
        elif kind == "time_out":
            queue.time_out(args[0], priorities)
        if queue:
            assert queue.due(min(i.expires_ns for i in queue))
        assert len(queue) == len(list(queue))

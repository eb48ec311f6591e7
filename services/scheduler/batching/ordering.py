"""`preserve_ordering`: responses are released in the order their requests arrived."""

from __future__ import annotations

from collections import deque


class OrderedRelease:
    def __init__(self) -> None:
        self._order: deque[str] = deque()
        self._waiting: set[str] = set()
        self._finished: dict[str, tuple[str, bytes | None]] = {}

    def arrived(self, rid: str) -> None:
        self._order.append(rid)
        self._waiting.add(rid)

    def finished(self, rid: str, reply: str, response: bytes | None) -> list[tuple[str, bytes]]:
        """Record a finished request; returns the (reply subject, response) pairs now due.

        `response` None means there is nothing to send (the request expired) but later
        requests may no longer wait for it.
        """
        if rid not in self._waiting:  # arrived before ordering applied: nothing to wait for
            return [(reply, response)] if response is not None else []
        self._finished[rid] = (reply, response)
        due = []
        while self._order and self._order[0] in self._finished:
            head = self._order.popleft()
            self._waiting.discard(head)
            held_reply, held = self._finished.pop(head)
            if held is not None:
                due.append((held_reply, held))
        return due

    def __len__(self) -> int:
        return len(self._order)

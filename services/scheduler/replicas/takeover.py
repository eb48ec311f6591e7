"""Taking over the lease of a scheduler replica that died, without waiting for the lease's TTL.

A lease names its holder's liveness subject (`Lease.alive`: `subjects.scheduler_alive`, which
only that process answers, subscribed before it claims anything). A replica that finds a model
it wants held by another asks that subject. NATS answers "no responders" at once when no
subscription for it exists anywhere in the cluster: no process with that identity is connected.
Seen in two rounds at least `CONFIRM_S` apart (`Verdicts`), the claimant replaces the lease with
a compare-and-set on the revision it read (two claimants cannot both win; a holder that renewed
meanwhile makes it fail). Anything else proves nothing and the TTL rule stays: an answer
(alive), a timeout (slow), a bus that is away, a lease that names no subject (written by an
older version). A partition is not always a timeout: a NATS route that goes down drops the
other side's subscriptions, so a claimant on the side with the leases stream's quorum gets "no
responders" for a holder on the other side and takes its lease, while that holder serves on
until its last renewal is TTL old (docs/reliability.md, "Known limits"). A holder alive but
disconnected for longer than `CONFIRM_S` also has no subscription: it loses the model, notices
on its first renewal (a failed compare-and-set) and hands it over like a lease that expired
(docs/design.md).
"""

from __future__ import annotations

import msgspec
from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError

from shared.wire.records import Lease

PING_S = 0.5  # a holder that does not answer within this is not judged: its lease keeps the TTL rule
CONFIRM_S = 1.0  # "no responders" counts once seen again at least this long after the first time
SETTLE_S = 2.0  # after our own (re)connect, nobody is judged dead for this long
STALE_S = 3.0  # a "no responders" older than this, with none since, starts the count again

_decoder = msgspec.msgpack.Decoder(Lease)


def suspect(value: bytes | None, mine: bytes) -> Lease | None:
    """The lease to judge, whose stored value is `value` (this replica's own is `mine`), by asking
    its `alive` subject; None: leave it to its TTL (ours, unreadable, or naming no subject)."""
    if not value or value == mine:
        return None
    try:
        lease = _decoder.decode(value)
    except msgspec.DecodeError:
        return None
    return lease if lease.alive else None


def dead(outcome: BaseException | None) -> bool:
    """Whether a ping's outcome (None: answered) proves the holder gone: "no responders" only."""
    return isinstance(outcome, NoRespondersError)


async def ping(nc: NATS, subject: str, timeout: float = PING_S) -> BaseException | None:
    """Ask a holder's liveness subject: None if it answered, else what happened instead."""
    try:
        await nc.request(subject, b"", timeout=timeout)
    except Exception as exc:  # judged by `dead`; nothing else is proof
        return exc
    return None


class Verdicts:
    """Which holders are dead: "no responders" in two rounds at least `CONFIRM_S` apart, with no
    other outcome between, and not within `SETTLE_S` of this replica's own (re)connect. Once was
    not enough: a holder reconnecting has no subscription for a few milliseconds, and a replica
    just connected to a restarted NATS node whose routes are not all up yet finds no responders
    for every holder on the other nodes. Times are `now` as passed (time.monotonic())."""

    def __init__(self, now: float) -> None:
        self.connected = now
        self._seen: dict[str, tuple[float, float]] = {}  # subject -> first and last "no responders", unbroken

    def reconnected(self, now: float) -> None:
        """What was seen before proves nothing now: our own connection may have been the cause."""
        self.connected = now
        self._seen.clear()

    def judge(self, subject: str, outcome: BaseException | None, now: float) -> bool:
        """Record a ping's outcome; whether its holder is now proven dead."""
        self._seen = {s: seen for s, seen in self._seen.items() if now - seen[1] <= STALE_S}
        if not dead(outcome):
            self._seen.pop(subject, None)
            return False
        first, _ = self._seen.get(subject, (now, now))
        self._seen[subject] = (first, now)
        return now - first >= CONFIRM_S and now - self.connected >= SETTLE_S

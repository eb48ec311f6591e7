"""Taking over the lease of a scheduler replica that died, without waiting for the lease's TTL.

A lease names its holder's liveness subject (`Lease.alive`: `subjects.scheduler_alive`, which
only that process answers, subscribed before it claims anything). A replica that finds a model
it wants held by another asks that subject. NATS answers "no responders" at once when no
subscription for it exists anywhere in the cluster: no process with that identity is connected,
so the claimant replaces the lease with a compare-and-set on the revision it read (two claimants
cannot both win; a holder that renewed meanwhile makes it fail). Anything else proves nothing
and the TTL rule stays: an answer (alive), a timeout (slow, or cut off by a partition), a bus
that is away, a lease that names no subject (written by an older version). A holder alive but
reconnecting also has no subscription: it loses the model, notices on its first renewal
(a failed compare-and-set) and hands it over like a lease that expired (docs/design.md).
"""

from __future__ import annotations

import msgspec
from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError

from shared.wire.records import Lease

PING_S = 0.5  # a holder that does not answer within this is not judged: its lease keeps the TTL rule

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

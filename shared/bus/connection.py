"""A connection to NATS: reconnecting for ever, its outages told once, and asking many responders at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec
import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from shared.bus import nats_internals

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Decoder(Protocol[T_co]):
    """What `decode` needs of a msgspec decoder. Not `msgspec.msgpack.Decoder[T]` itself: the
    compiled build's type check sees no third-party package (shoal/compiled_modules.py), so that parameter
    would be Any, T unsolved, and mypyc would take the result for None and refuse every message."""

    def decode(self, buf: bytes, /) -> T_co: ...


_reconnects: weakref.WeakKeyDictionary[NATS, int] = weakref.WeakKeyDictionary()  # per connection


Listener = Callable[[], object]


# per connection: (called when it is lost, called when it is back), for those that must act on both
_listeners: weakref.WeakKeyDictionary[NATS, list[tuple[Listener, Listener]]] = weakref.WeakKeyDictionary()


log = logging.getLogger(__name__)


class BusRefused(RuntimeError):
    """nats-server turned this service away (no credentials, or not these): retrying cannot help."""


def refusal(exc: Exception, url: str, credentials: str) -> BusRefused | None:
    """The clear error for nats-server's answer to a connection it does not admit, else None."""
    if isinstance(exc, ssl.SSLCertVerificationError) or "certificate verify failed" in str(exc).lower():
        where = f"beside --nats-credentials {credentials}" if credentials else "(no --nats-credentials given)"
        return BusRefused(
            f"NATS at {url} speaks TLS with a certificate this service cannot check: put the deployment's "
            f"{TRUSTED_CA} {where} (`shoal credentials --tls` makes it, docs/security.md): {exc}"
        )
    if "authorization violation" not in str(exc).lower():
        return None
    if not credentials:
        return BusRefused(
            f"NATS at {url} demands credentials and this service has none: pass --nats-credentials FILE "
            "(or SHOAL_<SERVICE>_NATS_CREDENTIALS; `shoal credentials --out DIR` makes them, docs/security.md)"
        )
    return BusRefused(
        f"NATS at {url} refused the credentials in --nats-credentials {credentials} (Authorization Violation)"
    )


ABANDON_S = 2.0  # how long closing a refused first connection may take

# the deployment's certificate authority, beside the identities (`shoal credentials --tls`,
# shared/process/tls_material.py): the directory that gives a service its identity gives it the CA
TRUSTED_CA = "ca.pem"


def credential_options(credentials: str) -> dict[str, Any]:
    """nats-py's options for a credentials file: an nkey seed (`shoal credentials`' files), or a
    decentralized `.creds` file (a user JWT and its seed, from `nsc`), and TLS trusting the CA found
    beside it. Read once here so that a missing or unreadable file stops the service at once, naming it."""
    if not credentials:
        return {}
    try:
        with open(credentials, "rb") as file:
            text = file.read()
    except OSError as exc:
        raise BusRefused(f"cannot read --nats-credentials {credentials}: {exc.strerror or exc}") from None
    options: dict[str, Any] = (
        {"user_credentials": credentials} if b"BEGIN NATS USER JWT" in text else {"nkeys_seed": credentials}
    )
    authority = Path(credentials).parent / TRUSTED_CA
    if authority.exists():  # a deployment with TLS on its bus: trust its own CA, and only it
        options["tls"] = ssl.create_default_context(cafile=str(authority))
        quiet_tls_eof_notice()
    return options


TLS_EOF_NOTICE = "returning true from eof_received() has no effect when using ssl"


class _TlsEofNotice(logging.Filter):
    """asyncio warns `TLS_EOF_NOTICE` whenever a TLS peer closes a connection made with asyncio's
    streams, as nats-py's are: the stdlib's stream protocol returns True there by design and the
    connection closes as it should. It tells a user nothing, and a client that connects for each
    look (`shoal autoscale` on a TLS bus, `shoal status`) printed it every look."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != TLS_EOF_NOTICE


def quiet_tls_eof_notice() -> None:
    """Drop asyncio's TLS EOF notice (once per process; asyncio's other warnings stay)."""
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _TlsEofNotice) for f in asyncio_log.filters):
        asyncio_log.addFilter(_TlsEofNotice())


class _Outage:
    """nats-py calls the error callback on every failed reconnect attempt (twice a second while
    the server is down): log the first error of an outage, then stay quiet until reconnected."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.down = False
        self.reported = False

    async def error(self, exc: Exception) -> None:
        if "permissions violation" in str(exc).lower():  # a publish or subscription this identity may not make
            log.error("nats refused: %s", exc)
            return
        if self.down and self.reported:
            log.debug("nats error while reconnecting: %s", exc)
            return
        self.reported = self.down
        # a lost connection is expected news, not a bug: no traceback for it
        expected = isinstance(exc, (OSError, nats.errors.UnexpectedEOF, nats.errors.StaleConnectionError))
        log.error("nats error: %s", exc or type(exc).__name__, exc_info=None if self.down or expected else exc)

    async def disconnected(self) -> None:
        if not self.down:
            log.warning("disconnected from nats; reconnecting")
        self.down, self.reported = True, False


async def connect(url: str, name: str, credentials: str = "") -> NATS:
    """A named connection (visible in nats-server's /connz) that reconnects forever, to any of
    the comma-separated servers in `url` (and the cluster members the server announces), as the
    identity in the `credentials` file (docs/security.md). A server that refuses the first
    connection for want of credentials raises `BusRefused` at once instead of being retried."""
    outage = _Outage(name)
    holder: list[NATS] = []
    options = credential_options(credentials)

    async def error_cb(exc: Exception) -> None:
        refused = refusal(exc, url, credentials) if not holder else None
        if refused is not None:
            raise refused  # out of nats-py's first-connect loop, which would retry it for ever
        await outage.error(exc)

    async def disconnected_cb() -> None:
        # nats-py calls this on a close we asked for too (drain at shutdown): only a lost connection warns
        if holder and holder[0].is_closed:
            log.debug("disconnected from nats (closing)")
        else:
            await outage.disconnected()
            for lost, _ in _listeners.get(holder[0], []) if holder else []:
                lost()

    async def reconnected_cb() -> None:
        outage.down = False
        url = holder[0].connected_url if holder else None
        log.info("reconnected to nats at %s", url.netloc if url else "?")
        if holder:  # watches restart: see `watch`
            _reconnects[holder[0]] = reconnects(holder[0]) + 1  # nats-py has no such counter
            for _, back in _listeners.get(holder[0], []):
                back()

    nc = NATS()
    try:
        # as keywords of a dict: nats-py types reconnect_time_wait as int, and a float works (half a second)
        settings: dict[str, Any] = {
            "servers": [u.strip() for u in url.split(",") if u.strip()],
            "name": name,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 0.5,
            "connect_timeout": 2,
            "allow_reconnect": True,
            "error_cb": error_cb,
            "disconnected_cb": disconnected_cb,
            "reconnected_cb": reconnected_cb,
            "pending_size": 8 * 1024 * 1024,
        }
        await nc.connect(**settings, **options)
    except BusRefused:
        await _abandon(nc)
        raise
    holder.append(nc)
    return nc


async def _abandon(nc: NATS) -> None:
    """Close a client nats-py left half-open when its error callback ended the first connect."""
    nats_internals.drop_transport(nc)
    with contextlib.suppress(Exception):  # bounded: a TLS handshake that failed leaves close() waiting for ever
        await asyncio.wait_for(nc.close(), ABANDON_S)


# After a reconnect to another node of a cluster, the subscriptions of the services that were on the
# dead node reach the other nodes only as each one reconnects and the nodes tell each other (route
# interest): a message published meanwhile to a subject whose subscriber has not arrived yet is
# dropped without a word. So what a reconnect must tell the others (a worker's holdings, a scheduler's
# ask for them) is said again after these delays, by when every survivor's interest has settled.
RECONNECT_SETTLE_S = (1.0, 2.5)


def on_connection(nc: NATS, lost: Listener, back: Listener) -> None:
    """`lost()` when `nc` (made by `connect`) loses its server, `back()` once it has reconnected
    (its subscriptions restored; what was published meanwhile is flushed after that)."""
    _listeners.setdefault(nc, []).append((lost, back))


def cluster_size(nc: NATS) -> int:
    """Servers in the NATS cluster this connection is on: the server announces the client URLs
    of its cluster peers (`connect_urls` in INFO), itself included."""
    info = nats_internals.server_info(nc)
    urls = set(info.get("connect_urls") or [])
    if info.get("cluster") and not urls:
        return 1
    return max(1, len(urls))


def no_responders(msg: Msg) -> bool:
    """NATS's own answer to a request nobody subscribed to: status 503, no payload."""
    return msg.headers is not None and msg.headers.get("Status") == "503"


def decode(decoder: Decoder[T], msg: Msg, logger: logging.Logger = log) -> T | None:
    """A message's payload decoded, or None (logged) when it does not decode: a bad message
    must never take a subscription down."""
    try:
        return decoder.decode(msg.data)
    except msgspec.DecodeError as exc:
        logger.error("undecodable message on %s: %s", msg.subject, exc)
        return None


async def gather(
    nc: NATS,
    subject: str,
    payload: bytes = b"",
    expected: int = 0,
    timeout: float = 5.0,
    settle: float = 0.015,
    declared: Callable[[bytes], int] | None = None,
    patience: float = 1.0,
) -> list[bytes]:
    """Ask every responder (scheduler replicas) and collect their answers.

    Returns as soon as `expected` answers are in, or as many as an answer declares there are
    (`declared(reply)`: the responders' own count, 0 when it cannot say), waiting at most
    `patience` seconds after the first answer for them. Otherwise, after the first answer, once
    `settle` seconds pass without another: a guess that a loaded machine defeats (a second
    replica's answer 20 ms late is lost), so responders that know their number should say it.
    No answer within `timeout`: an empty list."""
    inbox = nc.new_inbox()
    replies: list[bytes] = []
    arrived = asyncio.Event()

    async def collect(msg: Msg) -> None:
        if not no_responders(msg):
            replies.append(msg.data)
        arrived.set()

    sub = await nc.subscribe(inbox, cb=collect)
    try:
        await nc.publish(subject, payload, reply=inbox)
        try:
            await asyncio.wait_for(arrived.wait(), timeout)
        except asyncio.TimeoutError:
            return replies
        until = asyncio.get_running_loop().time() + patience
        while True:
            wanted = max([expected, *(declared(r) for r in replies)]) if declared else expected
            if wanted and len(replies) >= wanted:
                return replies
            arrived.clear()
            wait = until - asyncio.get_running_loop().time() if declared and wanted else settle
            try:
                await asyncio.wait_for(arrived.wait(), max(0.0, wait))
            except asyncio.TimeoutError:
                return replies
    finally:
        await sub.unsubscribe()


def reconnects(nc: NATS) -> int:
    return _reconnects.get(nc, 0)


async def settled(nc: NATS) -> None:
    """Everything this connection queued (its subscriptions too) has reached the server.

    `nc.flush()` alone does not say so: nats-py 2.16 writes its PING straight to the socket,
    ahead of commands still waiting for its flusher task, so the PONG can come back before a
    SUB sent just before it is registered (another connection's publish then finds no one)."""
    await nats_internals.flush_buffer(nc)
    await nc.flush()

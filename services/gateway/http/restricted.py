"""Triton's `--http-restricted-api=<api>[,<api>...]:<header>=<value>`: API groups that answer
only requests carrying that header with that value (403 otherwise).

A wrapper around the whole HTTP app, so every route is classified the way Triton's handlers are
(see docs/compatibility.md, item 15): the ASGI routes, and the inference requests the HTTP protocol
answers itself (`claim`/`respond`, services/gateway/http/protocol.py).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from services.inference.restrictions import CATEGORIES

if TYPE_CHECKING:  # the CLI parses the flag: it needs no HTTP protocol (uvicorn's) imported
    from services.gateway.http.protocol import Claim, Disconnect

Scope = MutableMapping[str, Any]


class HttpApp(Protocol):
    """What the gateway's HTTP listener serves: ASGI routes, and the requests it claims
    (`protocol.DirectHandler`)."""

    limit: int

    def claim(self, method: str, path: str) -> Claim | None: ...

    async def respond(
        self, claim: Claim, headers: Iterable[tuple[bytes, bytes]], body: bytes, size: int, disconnect: Disconnect
    ) -> tuple[int, bytes, dict[str, str]]: ...

    async def __call__(
        self, scope: Scope, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None: ...


_MODEL = r"/v2/models/[^/]+(?:/versions/[^/]+)?"
# Order matters: the first match wins (Triton's own routing: `/v2/models/stats` before a model).
_ROUTES = [
    (re.compile(r"^/v2/health/(?:live|ready)$"), "health"),
    (re.compile(r"^/v2/models/stats$"), "statistics"),
    (re.compile(rf"^{_MODEL}/ready$"), "health"),
    (re.compile(rf"^{_MODEL}/(?:infer|generate|generate_stream)$"), "inference"),
    (re.compile(rf"^{_MODEL}/config$"), "model-config"),
    (re.compile(rf"^{_MODEL}/stats$"), "statistics"),
    (re.compile(r"^/v2/models/[^/]+/trace/setting$"), "trace"),
    (re.compile(rf"^{_MODEL}$"), "metadata"),
    (re.compile(r"^/v2/?$"), "metadata"),
    (re.compile(r"^/v2/(?:systemsharedmemory|cudasharedmemory)(?:/.*)?$"), "shared-memory"),
    (re.compile(r"^/v2/repository(?:/.*)?$"), "model-repository"),
    (re.compile(r"^/v2/trace/setting$"), "trace"),
    (re.compile(r"^/v2/logging$"), "logging"),
]


@dataclass(frozen=True)
class Restriction:
    header: str  # lower case: HTTP header names are case-insensitive
    value: str


def parse(specs: list[str]) -> dict[str, Restriction]:
    """`["trace,logging:admin-key=secret", ...]` -> category -> restriction; ValueError with
    tritonserver's complaint for a malformed spec, an unknown category or one given twice."""
    restrictions: dict[str, Restriction] = {}
    for spec in specs:
        apis, sep, header = spec.partition(":")
        key, eq, value = header.partition("=")
        if not sep or not eq or not apis or not key:
            raise ValueError(
                f"--http-restricted-api option format is '<API_1>,<API_2>:<restricted-key>=<restricted-value>', "
                f"got '{spec}'"
            )
        if ":" in header:
            raise ValueError(f"--http-restricted-api takes one '<apis>:<key>=<value>' per flag, got '{spec}'")
        for api in (a.strip() for a in apis.split(",")):
            if api not in CATEGORIES:
                raise ValueError(f"unknown restricted API category '{api}' (one of {', '.join(CATEGORIES)})")
            if api in restrictions:
                raise ValueError(f"restricted API category '{api}' is given more than once")
            restrictions[api] = Restriction(key.strip().lower(), value)
    return restrictions


def category(path: str) -> str | None:
    for pattern, name in _ROUTES:
        if pattern.match(path):
            return name
    return None


class RestrictedAPI:
    """Answers 403 with Triton's text before the app sees a request it must not serve."""

    def __init__(self, app: HttpApp, restrictions: dict[str, Restriction]) -> None:
        self.app = app
        self.restrictions = restrictions
        self.limit = app.limit
        # what the app claims is inference (services/gateway/http/infer.py)
        self._claimed = restrictions.get("inference")

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        restriction = self._restriction(scope)
        if restriction is None or self._allowed(scope["headers"], restriction):
            await self.app(scope, receive, send)
            return
        status, body, headers = self._refused(restriction)
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        raw.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body})

    def claim(self, method: str, path: str) -> Claim | None:
        return self.app.claim(method, path)

    async def respond(
        self, claim: Claim, headers: Iterable[tuple[bytes, bytes]], body: bytes, size: int, disconnect: Disconnect
    ) -> tuple[int, bytes, dict[str, str]]:
        restriction = self._claimed
        if restriction is None or self._allowed(headers, restriction):
            return await self.app.respond(claim, headers, body, size, disconnect)
        return self._refused(restriction)

    @staticmethod
    def _refused(restriction: Restriction) -> tuple[int, bytes, dict[str, str]]:
        body = orjson.dumps({"error": f"This API is restricted, expecting header '{restriction.header}'"})
        return 403, body, {"content-type": "application/json"}

    def _restriction(self, scope: Scope) -> Restriction | None:
        if scope["type"] != "http" or not self.restrictions:
            return None
        name = category(scope["path"])
        return self.restrictions.get(name) if name else None

    @staticmethod
    def _allowed(headers: Iterable[tuple[bytes, bytes]], restriction: Restriction) -> bool:
        wanted = restriction.header.encode("latin-1")
        return any(k.lower() == wanted and v.decode("latin-1") == restriction.value for k, v in headers)


def wrap(app: HttpApp, specs: list[str]) -> HttpApp:
    """The app itself when nothing is restricted (no cost on the hot path)."""
    restrictions = parse(specs)
    return RestrictedAPI(app, restrictions) if restrictions else app

"""The Vertex AI endpoint (`--allow-vertex-ai`), as tritonserver's `src/vertex_ai_server.cc`.

A port of its own (`--vertex-ai-port`) with two routes read from Vertex AI's environment:
`AIP_HEALTH_ROUTE` answers as `GET /v2/health/ready`, `AIP_PREDICT_ROUTE` infers on the default
model (`--vertex-ai-default-model`, else the one model loaded). A predict request with the header
`X-Vertex-Ai-Triton-Redirect: <KServe path>` is sent to that read-only KServe endpoint instead
(model metadata, config, readiness, statistics and inference, server health and metadata,
shared-memory status, the repository index, `/metrics`); register, load and the like are
forbidden there. The requests are answered by the gateway's HTTP app (`cloud_endpoint.py`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from services.gateway.http import cloud_endpoint as cloud
from services.gateway.http.cloud_endpoint import App, Channel, Scope
from services.gateway.http.restricted import HttpApp

BINARY_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
REDIRECT = "x-vertex-ai-triton-redirect"

_MODEL = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?(?:/(ready|infer|config|stats))?")
_HEALTH = re.compile(r"/v2/health/(live|ready)")
_SHM = re.compile(r"/v2/(?:system|cuda)sharedmemory(?:/region/[^/]+)?/(status|register|unregister)")
_REPOSITORY = re.compile(r"/v2/repository(?:/[^/]+)?/(index|models/[^/]+/(?:load|unload))")


class NoDefaultModel(Exception):
    """No default model given, and the server has not exactly one model loaded."""


def redirected(path: str) -> tuple[str, str] | int:
    """The (method, path) a redirect header's endpoint is served as, or the status that refuses it."""
    if path in ("/metrics", "/v2/models/stats", "/v2") or _HEALTH.fullmatch(path):
        return "GET", path
    model = _MODEL.fullmatch(path)
    if model is not None:
        return ("POST" if model.group(3) == "infer" else "GET"), path
    shm = _SHM.fullmatch(path)
    if shm is not None:  # only status: registering needs the HTTP endpoint itself
        return ("GET", path) if shm.group(1) == "status" else 403
    repository = _REPOSITORY.fullmatch(path)
    if repository is not None:  # only the index: loading needs the HTTP endpoint itself
        return ("POST", path) if repository.group(1) == "index" else 403
    return 400


def header_length(content_type: str, content_length: int | None) -> int | None:
    """The JSON header's size a binary predict request gives in its content type (None: all JSON)."""
    return cloud.header_length(BINARY_MIME, content_type, content_length)


class VertexAi:
    """The ASGI app of the Vertex AI port, over the gateway's HTTP app and its metrics app."""

    def __init__(
        self, http: HttpApp, metrics: App, predict_route: str, health_route: str, default_model: Callable[[], str]
    ) -> None:
        self.http, self.metrics = http, metrics
        self.predict, self.health = re.compile(predict_route), re.compile(health_route)
        self.default_model = default_model

    async def __call__(self, scope: Scope, receive: Channel, send: Channel) -> None:
        if scope["type"] != "http":
            await self.http(scope, receive, send)  # lifespan
            return
        path = scope["path"]
        if self.health.fullmatch(path):
            await cloud.serve(self.http, cloud.at(scope, scope["method"], "/v2/health/ready"), receive, send)
            return
        if not self.predict.fullmatch(path):
            return await cloud.status(send, 400)
        target = cloud.headers_of(scope).get(REDIRECT)
        if target is None:
            return await self._infer_default(scope, receive, send)
        if scope["method"] != "POST":
            return await cloud.status(send, 405)
        where = redirected("/" + target)
        if isinstance(where, int):
            return await cloud.status(send, where)
        if where[1] == "/metrics":
            await self.metrics(cloud.at(scope, *where), receive, send)
            return
        await cloud.serve(self.http, cloud.at(scope, *where), receive, send)

    async def _infer_default(self, scope: Scope, receive: Channel, send: Channel) -> None:
        try:
            model = self.default_model()
            scope = cloud.with_header_length(scope, BINARY_MIME, cloud.headers_of(scope))
        except (ValueError, NoDefaultModel) as exc:
            return await cloud.error(send, str(exc))
        await cloud.serve(self.http, cloud.at(scope, scope["method"], f"/v2/models/{model}/infer"), receive, send)

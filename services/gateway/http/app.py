"""The HTTP front end: KServe v2 + Triton extensions over Starlette, a thin adapter on the core.

The route table is here; `/infer` is `infer.py`'s fast path, which the HTTP protocol calls
without ASGI (`protocol.py`), and every other route is a handler in `handlers.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Lifespan

from inference.server import InferenceServer
from services.gateway.http import restricted
from services.gateway.http.error_answers import error_answer
from services.gateway.http.handlers import Handlers, error_response
from services.gateway.http.infer import InferFastPath
from shared.errors import ShoalError

log = logging.getLogger("shoal.gateway")

Handler = Callable[[Request], Awaitable[Response]]


def triton_errors(handler: Handler) -> Handler:
    """Every failure becomes Triton's `{"error": ...}` with the matching status."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except HTTPException:
            raise
        except Exception as exc:
            if not isinstance(exc, ShoalError):  # a bug: it still answers (error_answers.py)
                log.exception("unhandled error on %s", request.url.path)
            status, body, headers = error_answer(exc)
            return Response(body, status_code=status, headers=headers)

    return wrapped


async def _not_found(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 404)
    return error_response("Method Not Allowed" if status == 405 else "Not Found", status)


def _shm_routes(h: Handlers) -> list[Route]:
    routes = []
    for kind, prefix in (("system", "/v2/systemsharedmemory"), ("cuda", "/v2/cudasharedmemory")):

        def bound(handler: Handler, kind: str = kind) -> Handler:
            async def with_kind(request: Request) -> Response:
                request.path_params["kind"] = kind
                return await handler(request)

            return triton_errors(with_kind)

        routes += [
            Route(prefix + "/status", bound(h.shm_status), methods=["GET"]),
            Route(prefix + "/region/{region}/status", bound(h.shm_status), methods=["GET"]),
            Route(prefix + "/region/{region}/register", bound(h.shm_register), methods=["POST"]),
            Route(prefix + "/unregister", bound(h.shm_unregister), methods=["POST"]),
            Route(prefix + "/region/{region}/unregister", bound(h.shm_unregister), methods=["POST"]),
        ]
    return routes


def build_app(
    server: InferenceServer,
    max_input_size: int,
    restricted_api: list[str] | None = None,
    lifespan: Lifespan[Starlette] | None = None,
    header_forward_pattern: str = "",
) -> restricted.HttpApp:
    h = Handlers(server, max_input_size)
    routes = [
        Route("/v2/health/live", triton_errors(h.live), methods=["GET"]),
        Route("/v2/health/ready", triton_errors(h.ready), methods=["GET"]),
        Route("/v2", triton_errors(h.server_metadata), methods=["GET"]),
        Route("/v2/models/stats", triton_errors(h.statistics), methods=["GET"]),
        Route("/v2/logging", triton_errors(h.logging_settings), methods=["GET", "POST"]),
        Route("/v2/trace/setting", triton_errors(h.trace_settings), methods=["GET", "POST"]),
        Route("/v2/models/{model}/trace/setting", triton_errors(h.trace_settings), methods=["GET", "POST"]),
        Route("/v2/repository/index", triton_errors(h.repository_index), methods=["POST"]),
        Route("/v2/repository/models/{model}/load", triton_errors(h.load), methods=["POST"]),
        Route("/v2/repository/models/{model}/unload", triton_errors(h.unload), methods=["POST"]),
        *_shm_routes(h),
    ]
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes += [
            Route(base, triton_errors(h.model_metadata), methods=["GET"]),
            Route(base + "/ready", triton_errors(h.model_ready), methods=["GET"]),
            Route(base + "/config", triton_errors(h.model_config), methods=["GET"]),
            Route(base + "/stats", triton_errors(h.statistics), methods=["GET"]),
            Route(base + "/generate", triton_errors(h.generate), methods=["POST"]),
            Route(base + "/generate_stream", triton_errors(h.generate_stream), methods=["POST"]),
        ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _not_found}, lifespan=lifespan)
    fast = InferFastPath(server.core, max_input_size, app, header_forward_pattern)
    return restricted.wrap(fast, restricted_api or [])

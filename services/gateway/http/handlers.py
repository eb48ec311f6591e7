"""The HTTP handlers besides `/infer`: each reads its path and body, calls the inference server
(`inference/server.py`) and renders its document as Triton's JSON."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from inference.server import InferenceServer
from inference.types import Answer, ParsedRequest
from services.gateway.http import codec
from services.gateway.http.generate import event, parse_generate, render_generate
from shared.config.model_config import ModelSpec
from shared.errors import ShoalError, invalid


def json_response(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def error_response(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(codec.error_body(message), status_code=status, media_type="application/json", headers=headers)


def decode_json(body: bytes, depth_limit: bool = True) -> Any:
    """A control-API body; a parse error is Triton's 500 with rapidjson's words (codec.load_json)."""
    return codec.load_json(body, depth_limit)


async def parse_json(request: Request, depth_limit: bool = True) -> Any:
    """A small control-API body (`{}` when empty)."""
    body = await request.body()
    return decode_json(body, depth_limit) if body.strip() else {}


async def json_body(request: Request) -> dict[str, Any]:
    doc = await parse_json(request)
    if not isinstance(doc, dict) or not isinstance(doc.get("parameters", {}), dict):
        raise invalid("the request body must be a JSON object with an optional 'parameters' object")
    return doc


def model_path(request: Request) -> tuple[str, str]:
    version = request.path_params.get("version", "")
    if version and not version.isdigit():
        raise HTTPException(404)
    return request.path_params["model"], version


def ok() -> Response:
    return Response(status_code=200, media_type="application/json")


class Handlers:
    def __init__(self, server: InferenceServer, max_input_size: int) -> None:
        self.server = server
        self.limit = max_input_size

    # -- health and metadata --------------------------------------------------------
    async def live(self, request: Request) -> Response:
        return Response(status_code=200)

    async def ready(self, request: Request) -> Response:
        return Response(status_code=200 if self.server.ready() else 400)

    async def server_metadata(self, request: Request) -> Response:
        return json_response(self.server.metadata())

    async def model_metadata(self, request: Request) -> Response:
        return json_response(self.server.model_metadata(*model_path(request)))

    async def model_ready(self, request: Request) -> Response:
        # tritonserver 2.51 answers an unknown, unloaded or failed model alike (docs/compatibility.md)
        if await self.server.model_is_ready(*model_path(request)):
            return Response(status_code=200)
        return error_response("Model version not ready", 400)

    async def model_config(self, request: Request) -> Response:
        return json_response(self.server.model_config(*model_path(request)))

    # -- generate extension --------------------------------------------------------------
    async def _generate_request(self, request: Request) -> tuple[ModelSpec, int, ParsedRequest]:
        name, version = model_path(request)
        try:
            spec, resolved = self.server.core.resolve(name, version)
        except ShoalError as exc:  # a model that loads on demand is loaded first
            spec, resolved = await self.server.core.load_on_demand(name, version, exc)
        if request.headers.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
            raise invalid("Unsupported content-encoding, only 'identity' is supported.")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:
            raise codec.size_error(int(declared), self.limit)
        body = await request.body()
        if len(body) > self.limit:
            raise codec.size_error(len(body), self.limit)
        return spec, resolved, parse_generate(spec, decode_json(body))

    async def generate(self, request: Request) -> Response:
        """Exactly one response, as flat JSON (decoupled models included)."""
        spec, resolved, parsed = await self._generate_request(request)
        answers = []
        async for item in self.server.core.stream(spec, resolved, parsed):
            if isinstance(item, ShoalError):
                raise item
            answers.append(item)
        if len(answers) != 1:
            raise invalid(
                f"generate expects exactly one response from model '{spec.name}', got {len(answers)}; "
                "use generate_stream"
            )
        body = render_generate(spec.name, resolved, parsed.id, answers[0].outputs, answers[0].parameters)
        return Response(body, media_type="application/json")

    async def generate_stream(self, request: Request) -> Response:
        """Server-sent events, one per response. An error before the first response is a plain
        JSON error with its status; after it, an `{"error": ...}` event (the status is sent)."""
        spec, resolved, parsed = await self._generate_request(request)
        stream = self.server.core.stream(spec, resolved, parsed)
        first = await anext(stream, None)
        if isinstance(first, ShoalError):
            await stream.aclose()
            raise first

        def render(item: Answer | ShoalError) -> bytes:
            if isinstance(item, ShoalError):
                return event(codec.error_body(item.message))
            return event(render_generate(spec.name, resolved, parsed.id, item.outputs, item.parameters))

        async def events() -> AsyncIterator[bytes]:
            try:
                if first is not None:
                    yield render(first)
                async for item in stream:
                    yield render(item)
            except ShoalError as exc:
                yield render(exc)
            finally:
                await stream.aclose()

        return StreamingResponse(events(), media_type="text/event-stream")

    # -- repository and statistics -------------------------------------------------------
    async def repository_index(self, request: Request) -> Response:
        # Triton reads only `ready` here: no nesting limit, the type checked (http_server.cc, HandleRepositoryIndex)
        doc = await parse_json(request, depth_limit=False)
        ready = None
        if doc != {}:
            ready = doc.get("ready", False) if isinstance(doc, dict) else None
            if not isinstance(ready, bool):
                raise invalid("Invalid value for 'ready': expected a boolean")
        return json_response(await self.server.repository_index(ready))

    async def load(self, request: Request) -> Response:
        doc = await json_body(request)
        await self.server.load(request.path_params["model"], doc.get("parameters", {}))
        return ok()

    async def unload(self, request: Request) -> Response:
        doc = await json_body(request)
        dependents = doc.get("parameters", {}).get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise invalid("Unable to parse 'unload_dependents': attempt to access JSON non-boolean as boolean")
        await self.server.unload(request.path_params["model"], dependents)
        return ok()

    async def statistics(self, request: Request) -> Response:
        name = request.path_params.get("model", "")
        version = request.path_params.get("version", "")
        if version and not version.isdigit():
            raise HTTPException(404)
        return json_response({"model_stats": msgspec.to_builtins(await self.server.statistics(name, version))})

    # -- trace and logging extensions ------------------------------------------------------------
    async def trace_settings(self, request: Request) -> Response:
        model = request.path_params.get("model", "")
        current = self.server.trace_settings(model)  # an unknown model's error comes before the body's
        if request.method != "POST":
            return json_response(current)
        return json_response(self.server.trace_settings(model, await parse_json(request)))

    async def logging_settings(self, request: Request) -> Response:
        update = await parse_json(request) if request.method == "POST" else None
        return json_response(await self.server.logging(update))

    # -- client shared memory ----------------------------------------------------------------
    async def shm_status(self, request: Request) -> Response:
        kind = request.path_params["kind"]
        return json_response(self.server.shm.status(kind, request.path_params.get("region", "")))

    async def shm_register(self, request: Request) -> Response:
        doc = await json_body(request)
        name = request.path_params["region"]
        if request.path_params["kind"] == "system":
            await self.server.shm.register_system(name, doc)
        else:
            await self.server.shm.register_cuda(name, doc)
        return ok()

    async def shm_unregister(self, request: Request) -> Response:
        await self.server.shm.unregister(request.path_params["kind"], request.path_params.get("region", ""))
        return ok()

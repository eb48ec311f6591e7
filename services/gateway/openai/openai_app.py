"""The OpenAI-compatible front end (docs/openai.md): routes over the same inference core as
the HTTP and gRPC front ends. It decodes OpenAI's JSON, sends the model's requests through
`InferenceCore.stream`, and writes OpenAI's JSON or server-sent events back.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from inference.core import InferenceCore
from services.gateway.openai import documents, requests
from services.gateway.openai.api_keys import ApiKeys
from services.gateway.openai.catalog import Kind, Offer, offers
from services.gateway.openai.choices import Choices
from services.gateway.openai.generation import Generation, Piece
from services.gateway.openai.openai_errors import OpenAIError, from_shoal, model_not_found
from services.gateway.openai.requests import choice_with_seed
from services.gateway.openai.tensors import embedding, embedding_request, generation_request
from services.gateway.openai.tool_parsers import DEFAULT as DEFAULT_PARSER
from services.gateway.openai.tool_parsers import tool_parser
from shared.config.model_config import ModelSpec
from shared.errors import ShoalError

log = logging.getLogger("shoal.gateway")

Handler = Callable[[Request], Awaitable[Response]]
_Indexed = tuple[int, Piece]  # a choice's index and one piece of its text


def _json(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def _event(doc: Any) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def openai_errors(handler: Handler) -> Handler:
    """Every failure answers in OpenAI's error shape with its status."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except OpenAIError as exc:
            return Response(exc.body(), status_code=exc.status, media_type="application/json")
        except ShoalError as exc:
            error = from_shoal(exc)
            return Response(error.body(), status_code=error.status, media_type="application/json")
        except Exception as exc:  # a bug must still answer, and the server keeps serving
            log.exception("unhandled error on %s", request.url.path)
            error = OpenAIError(f"internal error: {exc}", 500)
            return Response(error.body(), status_code=500, media_type="application/json")

    return wrapped


async def until_disconnected(request: Request, work: Awaitable[Response]) -> Response:
    """`work`'s response, or its cancellation (which cancels the model's requests) when the
    client goes away first: the body is read, so the next ASGI message is the disconnect."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled():
        return Response(status_code=499)  # nobody reads it
    return task.result()


class OpenAIHandlers:
    def __init__(self, core: InferenceCore, max_input_size: int, tool_call_parser: str = DEFAULT_PARSER) -> None:
        self.core = core
        self.tool_call_parser = tool_call_parser  # a model's config parameter wins
        self.limit = max_input_size
        self.created = int(time.time())

    # -- models ---------------------------------------------------------------------------
    def offers(self) -> list[Offer]:
        found = []
        for name in sorted(self.core.registry.specs):
            try:
                spec, _ = self.core.resolve(name)
            except ShoalError:  # not ready
                continue
            found.extend(offers(spec))
        return found

    def _resolve(self, name: str) -> tuple[ModelSpec, int]:
        """The model `name` is, or whose LoRA adapter it names (the model `a` for `a_lora_b`)."""
        try:
            return self.core.resolve(name)
        except ShoalError as exc:
            if exc.http_status != 404:
                raise from_shoal(exc) from None
        for model, spec in list(self.core.registry.specs.items()):
            if name.startswith(model) and any(served.model == name for served in offers(spec)):
                try:
                    return self.core.resolve(model)
                except ShoalError as exc:  # its model's status: 503 while it is not ready, say
                    raise model_not_found(name) if exc.http_status == 404 else from_shoal(exc) from None
        raise model_not_found(name)

    def _offer(self, name: str, kind: Kind, endpoint: str) -> tuple[ModelSpec, int, Offer]:
        spec, version = self._resolve(name)
        served = next((served for served in offers(spec) if served.model == name), None)
        if served is None:
            raise model_not_found(name)
        if served.kind != kind:
            raise OpenAIError(f"model '{name}' is an {served.kind} model: it cannot serve {endpoint}", 400, "model")
        return spec, version, served

    async def list_models(self, request: Request) -> Response:
        return _json(documents.model_list(self.offers(), self.created))

    async def get_model(self, request: Request) -> Response:
        name = request.path_params["model"]
        for served in self.offers():
            if served.model == name:
                return _json(documents.model_entry(served, self.created))
        raise model_not_found(name)

    async def _body(self, request: Request) -> Any:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:
            raise OpenAIError(f"request body of {declared} bytes exceeds the limit of {self.limit} bytes", 413)
        body = await request.body()
        if len(body) > self.limit:
            raise OpenAIError(f"request body of {len(body)} bytes exceeds the limit of {self.limit} bytes", 413)
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise OpenAIError(f"the request body is not valid JSON: {exc}", 400) from None

    # -- chat and completions ----------------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        return await self._generate(request, requests.parse_chat(await self._body(request)), True)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, requests.parse_completion(await self._body(request)), False)

    async def _generate(self, request: Request, asked: requests.GenerationRequest, chat: bool) -> Response:
        endpoint = "/v1/chat/completions" if chat else "/v1/completions"
        spec, version, served = self._offer(asked.model, Kind.GENERATION, endpoint)
        reply = documents.Reply(served.model, chat, asked.logprobs is not None)
        generations = []
        for i in range(asked.n):  # a seed given makes each choice its own: seed, seed + 1, ...
            one = asked if "seed" not in asked.sampling else choice_with_seed(asked, i)
            parsed = generation_request(spec, served, one, reply.id if asked.n == 1 else f"{reply.id}-{i}")
            tools = asked.tools
            forced = tools is not None and tools.choice != "auto"
            calls = tool_parser(spec, tools.parallel, self.tool_call_parser, forced) if tools is not None else None
            echo = (asked.prompt or "") if asked.echo else None
            logprobs = asked.logprobs is not None
            generation = Generation(self.core, spec, version, served, parsed, asked.stop, logprobs, calls, echo)
            generations.append(generation)
        choices = Choices(generations)
        if asked.stream:
            return await self._stream(choices, reply, asked.include_usage)
        return await until_disconnected(request, self._whole(choices, reply))

    @staticmethod
    async def _whole(choices: Choices, reply: documents.Reply) -> Response:
        return _json(reply.whole(await choices.whole(), choices.usage().document()))

    @staticmethod
    async def _stream(choices: Choices, reply: documents.Reply, include_usage: bool) -> Response:
        """Server-sent events. An error before the first piece is a plain error with its status;
        after it, an error event ends the stream (the status is already sent)."""
        pieces = choices.pieces()
        try:
            first = await anext(pieces)
        except BaseException:
            await pieces.aclose()
            raise

        async def events() -> AsyncIterator[bytes]:
            try:
                for index in range(len(choices.generations)):
                    if reply.chat:  # the role comes first, before any text
                        yield _event(reply.chunk("", None, include_usage, first=True, index=index))
                async for index, piece in _from(first, pieces):
                    if piece.text or piece.finish_reason or piece.logprobs or piece.tool_calls:
                        text, reason = piece.text or None, piece.finish_reason
                        chunk = reply.chunk(text, reason, include_usage, False, index, piece.logprobs, piece.tool_calls)
                        yield _event(chunk)
                if include_usage:
                    yield _event(reply.usage_chunk(choices.usage().document()))
                yield b"data: [DONE]\n\n"
            except ShoalError as exc:
                yield _event(from_shoal(exc).document())
            finally:
                await pieces.aclose()

        return StreamingResponse(events(), media_type="text/event-stream")

    # -- embeddings ------------------------------------------------------------------------------
    async def embeddings(self, request: Request) -> Response:
        asked = requests.parse_embedding(await self._body(request))
        spec, version, served = self._offer(asked.model, Kind.EMBEDDING, "/v1/embeddings")

        async def one(text: str) -> tuple[np.ndarray, int]:
            # one request per text: the model's dynamic batcher batches them with everyone else's
            answer = await self.core.infer(spec, version, embedding_request(spec, served, text, uuid.uuid4().hex))
            return embedding(served, answer.outputs)

        async def work() -> Response:
            results = await asyncio.gather(*(one(text) for text in asked.texts))
            vectors = [vector for vector, _ in results]
            return _json(documents.embeddings(spec.name, vectors, asked.base64, sum(n for _, n in results)))

        return await until_disconnected(request, work())

    async def ready(self, request: Request) -> Response:
        return Response(status_code=200)


async def _from(first: _Indexed, rest: AsyncIterator[_Indexed]) -> AsyncIterator[_Indexed]:
    yield first
    async for item in rest:
        yield item


async def _not_found(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 404)
    error = OpenAIError("Method Not Allowed" if status == 405 else f"no route for {request.url.path}", status)
    return Response(error.body(), status_code=status, media_type="application/json")


def with_key(keys: ApiKeys, handler: Handler) -> Handler:
    """`handler` for clients with an allowed API key only (none set: everyone)."""
    if not keys.required:
        return handler

    async def checked(request: Request) -> Response:
        keys.check(request.headers.get("authorization"))
        return await handler(request)

    return checked


def build_openai_app(
    core: InferenceCore, max_input_size: int, keys: ApiKeys | None = None, tool_call_parser: str = DEFAULT_PARSER
) -> Starlette:
    h = OpenAIHandlers(core, max_input_size, tool_call_parser)
    keys = keys or ApiKeys([])

    def api(handler: Handler) -> Handler:
        return openai_errors(with_key(keys, handler))

    routes = [
        Route("/v1/models", api(h.list_models), methods=["GET"]),
        Route("/v1/models/{model:path}", api(h.get_model), methods=["GET"]),
        Route("/v1/chat/completions", api(h.chat), methods=["POST"]),
        Route("/v1/completions", api(h.completions), methods=["POST"]),
        Route("/v1/embeddings", api(h.embeddings), methods=["POST"]),
        # an orchestrator's probe carries no key (as vLLM's and Triton's OpenAI front ends leave it open)
        Route("/health/ready", openai_errors(h.ready), methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: _not_found})

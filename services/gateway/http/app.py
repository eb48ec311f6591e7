"""The HTTP front end: KServe v2 + Triton extensions over Starlette, a thin adapter on the core."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import orjson
from nats.aio.client import Client as NATS
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from services.gateway.http import codec, restricted
from services.gateway.http.generate import event, parse_generate, render_generate
from services.inference import classification, trace, types
from services.inference.cache import ResponseCache, cache_key
from services.inference.core import InferenceCore
from services.inference.models import ModelRegistry
from services.inference.shm import DISABLED
from services.inference.validation import raw_request, validate
from shared import bus, logsettings, subjects
from shared.errors import ShoalError, invalid, unavailable, unsupported
from shared.messages import CacheEvent
from shared.repository_client import repository_call
from shared.settings import GatewaySettings

log = logging.getLogger("shoal.gateway")

SERVER_VERSION = "2.73.0"  # the Triton protocol level Shoal answers as
EXTENSIONS = [
    "classification",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
    "generate",
]


def json_response(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def _decode_json(body: bytes) -> Any:
    codec.check_depth(body)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:  # Triton's 400
        raise invalid(f"failed to parse the request JSON buffer: {exc}") from None


def error_response(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps({"error": message}), status_code=status, media_type="application/json", headers=headers
    )


Handler = Callable[[Request], Awaitable[Response]]


def triton_errors(handler: Handler) -> Handler:
    """Every failure becomes Triton's `{"error": ...}` with the matching status."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except HTTPException:
            raise
        except ShoalError as exc:
            headers = {"Accept-Encoding": "gzip, deflate"} if exc.message == "Unsupported compression type" else None
            return error_response(exc.message, exc.http_status, headers)
        except Exception as exc:  # a bug must still answer, and the server keeps serving
            log.exception("unhandled error on %s", request.url.path)
            return error_response(f"internal error: {exc}", 500)

    return wrapped


class Gateway:
    def __init__(self, settings: GatewaySettings, nc: NATS, registry: ModelRegistry, core: InferenceCore) -> None:
        self.settings = settings
        self.nc = nc
        self.registry = registry
        self.core = core
        self.shm = core.shm
        self.log_settings = logsettings.LogSettings(log_verbose_level=settings.log_verbose)
        self.cache = ResponseCache(settings.cache_bytes) if settings.cache_bytes > 0 else None
        self.tracer = trace.Tracer(
            trace.TraceSettings(
                tuple(level.strip().upper() for level in settings.trace_level.split(",")),
                settings.trace_rate,
                settings.trace_count,
                settings.trace_log_frequency,
                settings.trace_file,
            )
        )

    # -- health and metadata --------------------------------------------------------
    async def live(self, request: Request) -> Response:
        return Response(status_code=200)

    async def ready(self, request: Request) -> Response:
        ok = self.registry.synced.is_set() and (not self.settings.strict_readiness or self.registry.all_ready())
        return Response(status_code=200 if ok else 400)

    async def server_metadata(self, request: Request) -> Response:
        return json_response({"name": self.settings.id, "version": SERVER_VERSION, "extensions": EXTENSIONS})

    @staticmethod
    def _model(request: Request) -> tuple[str, str]:
        version = request.path_params.get("version", "")
        if version and not version.isdigit():
            raise HTTPException(404)
        return request.path_params["model"], version

    async def model_metadata(self, request: Request) -> Response:
        name, version = self._model(request)
        spec, resolved = self.registry.resolve(name, version)
        versions = [str(resolved)] if version else [str(v) for v in self.registry.ready_versions(name)]
        lead = [-1] if spec.max_batch_size > 0 else []

        def io(tensors):
            return [{"name": t.name, "datatype": t.datatype, "shape": lead + list(t.dims)} for t in tensors]

        return json_response(
            {
                "name": name,
                "versions": versions,
                "platform": spec.metadata_platform,
                "inputs": io(spec.inputs),
                "outputs": io(spec.outputs),
            }
        )

    async def model_ready(self, request: Request) -> Response:
        name, version = self._model(request)
        if name not in self.registry.records:
            return error_response(f"Request for unknown model: '{name}' is not found", 404)
        return Response(status_code=200 if self.registry.is_ready(name, version) else 400)

    async def model_config(self, request: Request) -> Response:
        name, version = self._model(request)
        spec, _ = self.registry.resolve(name, version)
        return json_response(spec.config)

    # -- inference ------------------------------------------------------------------
    async def infer(
        self, model: str, version: str, headers: dict[str, str], body: bytes
    ) -> tuple[bytes, dict[str, str]]:
        """One inference: request bytes and headers in, response bytes and headers out."""
        started = time.monotonic_ns()
        spec, resolved = self.registry.resolve(model, version)
        limit = self.settings.http_max_input_size
        body = codec.decompress(body, headers.get("content-encoding"), limit)
        header_length = headers.get("inference-header-content-length")
        if header_length is not None and header_length.strip() == "0":
            parsed = raw_request(spec, body)
        else:
            header, binary = codec.split_body(body, header_length)
            parsed = codec.parse_request(header, binary, model)
        if not self.shm.enabled and any(t.in_shared_memory for t in parsed.inputs + (parsed.outputs or [])):
            raise unsupported(DISABLED)
        valid = validate(spec, parsed)
        key = cache_key(model, resolved, parsed, valid) if self.cache is not None and spec.response_cache else None
        cached = self.cache.get(key) if key is not None else None
        traced = False
        if cached is not None:
            outputs = [
                types.OutputTensor(o.name, o.datatype, o.shape, o.data, valid.binary.get(o.name, False)) for o in cached
            ]
            parameters, response = {}, None
            await self._cache_event(model, resolved, True, time.monotonic_ns() - started)
        else:
            traced = self.tracer.sample(model)
            outputs, parameters, response = await self.core.infer(spec, resolved, parsed, valid, traced)
            if key is not None:
                inserted = time.monotonic_ns()
                self.cache.put(key, outputs)
                await self._cache_event(model, resolved, False, time.monotonic_ns() - inserted)
        classify = {o.name: o.classification for o in parsed.outputs or [] if o.classification}
        if classify:
            outputs = [
                classification.classify(o, classify[o.name], spec.max_batch_size > 0) if o.name in classify else o
                for o in outputs
            ]
        content, json_length = codec.encode_response(model, resolved, parsed.id, outputs, parameters)
        if traced:
            timestamps = {"REQUEST_START": started, **response.trace, "REQUEST_END": time.monotonic_ns()}
            self.tracer.record(model, resolved, parsed.id, timestamps, response.batch)
        out_headers = {"content-type": "application/json"}
        if json_length is not None:
            out_headers = {
                "content-type": "application/octet-stream",
                "inference-header-content-length": str(json_length),
            }
        encoding = codec.choose_encoding(headers.get("accept-encoding"))
        if encoding:
            content = codec.compress(content, encoding)
            out_headers["content-encoding"] = encoding
        return content, out_headers

    # -- generate extension --------------------------------------------------------------
    async def _generate_request(self, request: Request):
        name, version = self._model(request)
        spec, resolved = self.registry.resolve(name, version)
        if request.headers.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
            raise invalid("Unsupported content-encoding, only 'identity' is supported.")
        limit = self.settings.http_max_input_size
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise codec.size_error(int(declared), limit)
        body = await request.body()
        if len(body) > limit:
            raise codec.size_error(len(body), limit)
        parsed = parse_generate(spec, _decode_json(body))
        valid = validate(spec, parsed, streaming=True)
        return spec, resolved, parsed, valid

    async def generate(self, request: Request) -> Response:
        """Exactly one response, as flat JSON (decoupled models included)."""
        spec, resolved, parsed, valid = await self._generate_request(request)
        answers = []
        async for item in self.core.stream(spec, resolved, parsed, valid):
            if isinstance(item, ShoalError):
                raise item
            answers.append(item)
        if len(answers) != 1:
            raise invalid(
                f"generate expects exactly one response from model '{spec.name}', got {len(answers)}; "
                "use generate_stream"
            )
        outputs, parameters, _ = answers[0]
        return Response(
            render_generate(spec.name, resolved, parsed.id, outputs, parameters), media_type="application/json"
        )

    async def generate_stream(self, request: Request) -> Response:
        """Server-sent events, one per response. An error before the first response is a plain
        JSON error with its status; after it, an `{"error": ...}` event (the status is sent)."""
        spec, resolved, parsed, valid = await self._generate_request(request)
        stream = self.core.stream(spec, resolved, parsed, valid)
        first = await anext(stream, None)
        if isinstance(first, ShoalError):
            await stream.aclose()
            raise first

        def render(item) -> bytes:
            if isinstance(item, ShoalError):
                return event(orjson.dumps({"error": item.message}))
            outputs, parameters, _ = item
            return event(render_generate(spec.name, resolved, parsed.id, outputs, parameters))

        async def events():
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

    async def _cache_event(self, model: str, version: int, hit: bool, ns: int) -> None:
        event = CacheEvent(model, version, hit, ns, ns if hit else 0)
        await self.nc.publish(subjects.SCHEDULER_CACHE, msgspec.msgpack.encode(event))

    # -- repository and statistics -------------------------------------------------------
    async def _ask(self, subject: str, payload: bytes, what: str) -> Any:
        try:
            reply = await self.nc.request(subject, payload, timeout=10)
        except Exception as exc:
            raise unavailable(f"{what} is not available: {type(exc).__name__}") from None
        return msgspec.json.decode(reply.data)

    async def repository_index(self, request: Request) -> Response:
        doc = await self._parse_json(request)
        payload = b""
        if doc != {}:
            ready = doc.get("ready", False) if isinstance(doc, dict) else None
            if not isinstance(ready, bool):
                raise invalid("attempt to access JSON non-boolean as boolean")  # Triton's text, unprefixed
            payload = orjson.dumps({"ready": ready})
        return json_response(await self._ask(subjects.REPOSITORY_INDEX, payload, "the repository service"))

    @staticmethod
    async def _parse_json(request: Request) -> Any:
        """A small control-API body (`{}` when empty); a parse error is Triton's 400."""
        body = await request.body()
        return _decode_json(body) if body.strip() else {}

    async def _json_body(self, request: Request) -> dict:
        doc = await self._parse_json(request)
        if not isinstance(doc, dict) or not isinstance(doc.get("parameters", {}), dict):
            raise invalid("the request body must be a JSON object with an optional 'parameters' object")
        return doc

    async def _repository(self, subject: str, payload: dict) -> Response:
        revision = await repository_call(self.nc, subject, payload, self.settings.repository_timeout_s)
        # answer only once this gateway sees the change, so the client's next call does too
        await self.registry.seen(payload["name"], revision)
        return Response(status_code=200, media_type="application/json")

    async def load(self, request: Request) -> Response:
        doc = await self._json_body(request)
        name = request.path_params["model"]
        return await self._repository(subjects.REPOSITORY_LOAD, {"name": name, "parameters": doc.get("parameters", {})})

    async def unload(self, request: Request) -> Response:
        doc = await self._json_body(request)
        dependents = doc.get("parameters", {}).get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise invalid("Unable to parse 'unload_dependents': attempt to access JSON non-boolean as boolean")
        name = request.path_params["model"]
        return await self._repository(subjects.REPOSITORY_UNLOAD, {"name": name, "unload_dependents": dependents})

    async def statistics(self, request: Request) -> Response:
        name = request.path_params.get("model", "")
        version = request.path_params.get("version", "")
        if version and not version.isdigit():
            raise HTTPException(404)
        if name:
            if not self.registry.ready_versions(name):
                raise invalid(f"requested model '{name}' is not available")
            if version and int(version) not in self.registry.ready_versions(name):
                raise invalid(f"requested model version is not available for model '{name}'")
        stats = await scheduler_stats(self.nc)
        entries = []
        for model in sorted(self.registry.records) if not name else [name]:
            for v in self.registry.ready_versions(model):
                if version and v != int(version):
                    continue
                entry = stats.get(f"{model}/{v}", {}).get("stats")
                entries.append(entry or empty_stats(model, str(v)))
        return json_response({"model_stats": entries})

    # -- trace extension ------------------------------------------------------------------------
    async def trace_settings(self, request: Request) -> Response:
        model = request.path_params.get("model", "")
        if model and not self.registry.ready_versions(model):
            raise invalid(f"Request for unknown model : {model}")
        if request.method == "POST":
            doc = await self._parse_json(request)
            settings = self.tracer.update_model(model, doc) if model else self.tracer.update_global(doc)
        else:
            settings = self.tracer.for_model(model) if model else self.tracer.settings
        return json_response(settings.json())

    # -- logging extension ---------------------------------------------------------------------
    async def logging_settings(self, request: Request) -> Response:
        if request.method == "POST":
            self.log_settings = logsettings.update(self.log_settings, await self._parse_json(request))
            # every service (this gateway included) applies it from the bus
            await self.nc.publish(subjects.LOGGING, msgspec.json.encode(self.log_settings))
        return json_response(self.log_settings.json())

    # -- client shared memory ----------------------------------------------------------------
    async def shm_status(self, request: Request) -> Response:
        kind = request.path_params["kind"]
        return json_response(self.shm.status(kind, request.path_params.get("region", "")))

    async def shm_register(self, request: Request) -> Response:
        doc = await self._json_body(request)
        name = request.path_params["region"]
        if request.path_params["kind"] == "system":
            await self.shm.register_system(name, doc)
        else:
            await self.shm.register_cuda(name, doc)
        return Response(status_code=200, media_type="application/json")

    async def shm_unregister(self, request: Request) -> Response:
        await self.shm.unregister(request.path_params["kind"], request.path_params.get("region", ""))
        return Response(status_code=200, media_type="application/json")


_replicas = {"count": 0, "learned": 0.0}  # scheduler replicas that answered a full gather, and when


async def scheduler_stats(nc: NATS, payload: bytes = b"") -> dict[str, Any]:
    """Every scheduler replica's statistics for the models it serves, merged.

    Waiting for a quiet moment costs a few ms per call, so the replica count from the last
    full gather (renewed every second, so new replicas are seen) ends the wait early."""
    fresh = time.monotonic() - _replicas["learned"] < 1.0
    replies = await bus.gather(nc, subjects.SCHEDULER_STATS, payload, expected=_replicas["count"] if fresh else 0)
    if not replies:
        raise unavailable("the scheduler is not available")
    if not fresh:
        _replicas.update(count=len(replies), learned=time.monotonic())
    merged: dict[str, Any] = {}
    for reply in replies:
        for key, value in msgspec.json.decode(reply).items():
            merged[key] = merge_stats(merged[key], value) if key in merged else value
    return merged


_NOT_ADDED = {"quantiles", "first_response_buckets", "free_credits", "cache_enabled"}


def merge_stats(a: Any, b: Any, key: str = "") -> Any:
    """Two replicas' statistics of one model version (a model served by one, then another):
    counts and durations add up, `last_inference` is the later, quantiles are not added."""
    if key in _NOT_ADDED:
        return a or b
    if key == "last_inference":
        return max(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: merge_stats(a[k], b[k], k) if k in a and k in b else a.get(k, b.get(k)) for k in {**a, **b}}
    if isinstance(a, list) and isinstance(b, list):
        if all(isinstance(x, dict) and "batch_size" in x for x in a + b):  # batch_stats: by size
            sizes: dict[int, Any] = {}
            for entry in a + b:
                size = entry["batch_size"]
                sizes[size] = merge_stats(sizes[size], entry) if size in sizes else entry
            return [dict(v, batch_size=k) for k, v in sorted(sizes.items())]
        if len(a) == len(b) and all(isinstance(x, (int, float)) for x in a + b):  # histogram counts
            return [x + y for x, y in zip(a, b)]
        return a if len(a) >= len(b) else b
    if isinstance(a, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return a or b
    return a + b


def empty_stats(model: str, version: str) -> dict[str, Any]:
    from services.scheduler.statistics.stats import ModelStats

    return ModelStats().json(model, version)


async def _not_found(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 404)
    return error_response("Method Not Allowed" if status == 405 else "Not Found", status)


def build_app(gateway: Gateway, lifespan=None) -> Starlette:
    g = gateway
    m, mv = "/v2/models/{model}", "/v2/models/{model}/versions/{version}"
    routes = [
        Route("/v2/health/live", triton_errors(g.live), methods=["GET"]),
        Route("/v2/health/ready", triton_errors(g.ready), methods=["GET"]),
        Route("/v2", triton_errors(g.server_metadata), methods=["GET"]),
        Route("/v2/models/stats", triton_errors(g.statistics), methods=["GET"]),
        Route("/v2/logging", triton_errors(g.logging_settings), methods=["GET", "POST"]),
        Route("/v2/trace/setting", triton_errors(g.trace_settings), methods=["GET", "POST"]),
        Route("/v2/models/{model}/trace/setting", triton_errors(g.trace_settings), methods=["GET", "POST"]),
        Route("/v2/repository/index", triton_errors(g.repository_index), methods=["POST"]),
        Route("/v2/repository/models/{model}/load", triton_errors(g.load), methods=["POST"]),
        Route("/v2/repository/models/{model}/unload", triton_errors(g.unload), methods=["POST"]),
    ]
    for kind, prefix in (("system", "/v2/systemsharedmemory"), ("cuda", "/v2/cudasharedmemory")):

        def bound(handler, kind=kind):
            async def with_kind(request: Request) -> Response:
                request.path_params["kind"] = kind
                return await handler(request)

            return triton_errors(with_kind)

        routes += [
            Route(prefix + "/status", bound(g.shm_status), methods=["GET"]),
            Route(prefix + "/region/{region}/status", bound(g.shm_status), methods=["GET"]),
            Route(prefix + "/region/{region}/register", bound(g.shm_register), methods=["POST"]),
            Route(prefix + "/unregister", bound(g.shm_unregister), methods=["POST"]),
            Route(prefix + "/region/{region}/unregister", bound(g.shm_unregister), methods=["POST"]),
        ]
    for base in (m, mv):
        routes += [
            Route(base, triton_errors(g.model_metadata), methods=["GET"]),
            Route(base + "/ready", triton_errors(g.model_ready), methods=["GET"]),
            Route(base + "/config", triton_errors(g.model_config), methods=["GET"]),
            Route(base + "/stats", triton_errors(g.statistics), methods=["GET"]),
            Route(base + "/generate", triton_errors(g.generate), methods=["POST"]),
            Route(base + "/generate_stream", triton_errors(g.generate_stream), methods=["POST"]),
        ]
    app = InferFastPath(
        gateway, Starlette(routes=routes, exception_handlers={HTTPException: _not_found}, lifespan=lifespan)
    )
    return restricted.wrap(app, gateway.settings.http_restricted_api)


_INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")


class InferFastPath:
    """`POST .../infer` as a plain ASGI handler; everything else goes to Starlette.

    Inference is the hot path: skipping Starlette's middleware stack, route table and
    Request/Response objects saves a measurable share of the gateway's CPU per request
    (see the benchmark notes in the README).
    """

    def __init__(self, gateway: Gateway, app: Starlette) -> None:
        self.gateway = gateway
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        match = _INFER_PATH.match(scope["path"]) if scope["type"] == "http" else None
        if match is None:
            await self.app(scope, receive, send)
            return
        model, version = match.group(1), match.group(2) or ""  # ASGI paths arrive percent-decoded
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            if scope["method"] != "POST":
                raise _HTTPError(405, "Method Not Allowed")
            if version and not version.isdigit():
                raise _HTTPError(404, "Not Found")
            body = await self._body(receive, headers)
            content, out_headers = await self._until_disconnect(
                self.gateway.infer(model, version, headers, body), receive
            )
            status = 200
            log.debug("infer '%s' done", model)
        except _HTTPError as exc:
            status, content, out_headers = exc.status, orjson.dumps({"error": exc.message}), _JSON
        except ShoalError as exc:
            status, content = exc.http_status, orjson.dumps({"error": exc.message})
            out_headers = dict(_JSON)
            if exc.message == "Unsupported compression type":
                out_headers["accept-encoding"] = "gzip, deflate"
            log.debug("infer '%s' failed with %d: %s", model, status, exc.message)
        except Exception as exc:  # a bug must still answer, and the server keeps serving
            log.exception("unhandled error on %s", scope["path"])
            status, content, out_headers = 500, orjson.dumps({"error": f"internal error: {exc}"}), _JSON
        raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out_headers.items()]
        raw_headers.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": content})

    @staticmethod
    async def _until_disconnect(work, receive):
        """Run the inference in this task, cancelling it end to end if the client goes away first
        (one watcher task per request: the inference itself needs no task of its own)."""
        handler = asyncio.current_task()
        gone = asyncio.Event()

        async def watch() -> None:
            message = await receive()  # after the body, the next message is the disconnect
            if message.get("type") == "http.disconnect":
                gone.set()
                handler.cancel()  # the dispatcher tells the scheduler; the request leaves its queue

        watcher = asyncio.ensure_future(watch())
        try:
            return await work
        except asyncio.CancelledError:
            if gone.is_set():
                raise _HTTPError(499, "client disconnected") from None
            raise
        finally:
            watcher.cancel()

    async def _body(self, receive, headers: dict[str, str]) -> bytes:
        limit = self.gateway.settings.http_max_input_size
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _HTTPError(400, "client disconnected")
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            size += len(chunk)
            if size <= limit:
                chunks.append(chunk)
            elif size > 4 * limit:  # not worth reading further: the connection gets closed
                break
        if size > limit:
            # the rest of an oversize body was read (and dropped) so the client gets this
            # error rather than a connection reset
            declared = headers.get("content-length", "")
            total = int(declared) if declared.isdigit() else size
            if headers.get("inference-header-content-length", "").strip() == "0":
                raise codec.raw_size_error(total, limit)
            raise codec.size_error(total, limit)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_JSON = {"content-type": "application/json"}


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status, self.message = status, message

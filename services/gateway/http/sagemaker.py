"""The SageMaker endpoint (`--allow-sagemaker`), as tritonserver's `src/sagemaker_server.cc`, for
one model: a port of its own (`--sagemaker-port`) where `/ping` answers as `/v2/health/<mode>`
(`SAGEMAKER_TRITON_PING_MODE`, ready by default) and `/invocations` as the `infer`, `generate` or
`generate_stream` route (`SAGEMAKER_TRITON_INFERENCE_TYPE`) of the model
`SAGEMAKER_TRITON_DEFAULT_MODEL_NAME` names. A binary request gives its JSON header's size in its
content type, and a binary answer says it there too, instead of `Inference-Header-Content-Length`.
The multi-model API (`/models`: loading a model from a path, listing, invoking, unloading) is
`sagemaker_models.py`'s. The requests are answered by the gateway's HTTP app (`cloud_endpoint.py`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from services.gateway.http import cloud_endpoint as cloud
from services.gateway.http.cloud_endpoint import Answer, Channel, Scope
from services.gateway.http.restricted import HttpApp
from services.gateway.http.sagemaker_models import MultiModel, failed

BINARY_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
INFERENCE_TYPES = ("infer", "generate", "generate_stream")
_MODELS = re.compile(r"/models(?:/)?([^/]+)?(/invoke)?")


def binary_answer(answer: Answer) -> Answer:
    """An inference answer as SageMaker's clients read it: a binary one says its JSON header's
    size in its content type."""
    status, content, headers = answer
    length = headers.get("inference-header-content-length")
    if length is None:
        return answer
    kept = {k: v for k, v in headers.items() if k not in ("inference-header-content-length", "content-type")}
    return status, content, {**kept, "content-type": BINARY_MIME + length}


class SageMaker:
    """The ASGI app of the SageMaker port, over the gateway's HTTP app."""

    def __init__(
        self,
        http: HttpApp,
        model: str,
        inference_type: str = "infer",
        ping_mode: str = "ready",
        multi: MultiModel | None = None,
    ) -> None:
        self.http = http
        self.model, self.inference_type, self.ping_mode = model, inference_type, ping_mode
        self.multi = multi or MultiModel(http)

    async def __call__(self, scope: Scope, receive: Channel, send: Channel) -> None:
        if scope["type"] != "http":
            await self.http(scope, receive, send)  # lifespan
            return
        path = scope["path"]
        if path == "/ping":
            await cloud.serve(
                self.http, cloud.at(scope, scope["method"], f"/v2/health/{self.ping_mode}"), receive, send
            )
        elif path == "/invocations":
            await self._invoke(scope, receive, send, self.model, self.inference_type)
        elif (models := _MODELS.fullmatch(path)) is not None:
            await self._multi_model(scope, receive, send, models.group(1) or "", bool(models.group(2)))
        else:
            await cloud.status(send, 400)

    async def _multi_model(self, scope: Scope, receive: Channel, send: Channel, name: str, invoke: bool) -> None:
        """tritonserver's dispatch of `/models[/<name>][/invoke]` by method."""
        method = scope["method"]
        if method == "GET":
            await (self.multi.get(scope, send, name) if name else self.multi.list(scope, send))
        elif method == "POST" and invoke:
            target = self.multi.invoked(scope, name)
            if target is None:
                return await cloud.status(send, 404)
            await self._invoke(scope, receive, send, target, "infer", failed)
        elif method == "POST":
            await self.multi.load(scope, receive, send)
        elif method == "DELETE":
            await self.multi.unload(scope, send, name)
        else:
            await cloud.status(send, 400)

    async def _invoke(
        self,
        scope: Scope,
        receive: Channel,
        send: Channel,
        model: str,
        inference_type: str,
        errors: Callable[[Answer], Answer] = lambda answer: answer,
    ) -> None:
        # SageMaker's clients send neither compressed bodies nor accept compressed answers
        headers = {k: v for k, v in cloud.headers_of(scope).items() if k not in ("content-encoding", "accept-encoding")}
        scope = {**scope, "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]}
        if inference_type == "infer":
            try:
                scope = cloud.with_header_length(scope, BINARY_MIME, headers)
            except ValueError as exc:
                return await cloud.error(send, str(exc))
        path = f"/v2/models/{model}/{inference_type}"
        await cloud.serve(
            self.http, cloud.at(scope, scope["method"], path), receive, send, _both(binary_answer, errors)
        )


def _both(first: Callable[[Answer], Answer], then: Callable[[Answer], Answer]) -> Callable[[Answer], Answer]:
    return lambda answer: then(first(answer))

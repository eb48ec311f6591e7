"""SageMaker's multi-model API on the SageMaker port (`--allow-sagemaker`), as tritonserver's
`src/sagemaker_server.cc` answers it: `POST /models {"model_name", "url"}` loads the model at `url`
(sagemaker_archive.py) under the name the `X-Amzn-SageMaker-Target-Model` header gives, else
`model_name`; `GET /models` lists what was loaded this way (an empty object for a model not ready),
`GET /models/<name>` shows one, `POST /models/<name>/invoke` infers and `DELETE /models/<name>`
unloads it with its dependents. Each step is a request to the gateway's HTTP app, so its model
control mode, restrictions and errors apply: loading needs `--model-control-mode=explicit`, as
tritonserver's repository registration does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from services.gateway.http import cloud_endpoint as cloud
from services.gateway.http import sagemaker_archive as archive
from services.gateway.http.cloud_endpoint import Answer, Channel, Scope
from services.gateway.http.restricted import HttpApp

log = logging.getLogger("shoal.gateway")

TARGET_HEADER = "x-amzn-sagemaker-target-model"
UNLOAD_TIMEOUT_S = 350.0  # SageMaker waits 360 s for an unload; tritonserver gives it 350
# the texts tritonserver takes for running out of memory: a load or invoke failing so answers 507
OOM_TEXTS = (
    "CUDA out of memory",
    "CUDA_OUT_OF_MEMORY",
    "Out of memory",
    "Out Of Memory",
    "out of memory",
    "MemoryError",
    "OutOfMemory",
    "OOM",
    "Dst tensor is not initialized",
    "Src tensor is not initialized",
    "CNMEM_STATUS_OUT_OF_MEMORY",
    "CUDNN_STATUS_NOT_INITIALIZED",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUBLAS_STATUS_NOT_INITIALIZED",
    "Failed to allocate memory",
    "failed to allocate memory",
    "No space left on device",
)


def failed(reply: Answer) -> Answer:
    """A failed load or invoke as tritonserver's SageMaker endpoint answers it: 400 with the
    error, 507 when the error says the memory ran out; a success unchanged."""
    status, content, headers = reply
    if status == 200:
        return reply
    code = 507 if any(text in content.decode(errors="replace") for text in OOM_TEXTS) else 400
    return code, content, headers


class MultiModel:
    """The models loaded through `/models`: name -> modelUrl (tritonserver's list of them)."""

    def __init__(self, http: HttpApp, root: str = archive.MODELS_ROOT, limit: int = 64 << 20) -> None:
        self.http = http
        self.root, self.limit = root, limit  # the directories a url may name; the bytes a load may carry
        self.models: dict[str, str] = {}
        self.targets: dict[str, str] = {}  # name -> the model loaded for it (the target header's)
        self.lock = asyncio.Lock()  # one load or unload at a time, as tritonserver's list lock

    async def list(self, scope: Scope, send: Channel) -> None:
        if await self._refused(scope, send):
            return
        listed = []
        # a snapshot: a DELETE may end between the awaits below
        for name, url, target in [(n, u, self.targets[n]) for n, u in self.models.items()]:
            ready = await cloud.ask(self.http, scope, "GET", f"/v2/models/{target}/ready")
            listed.append({"modelName": name, "modelUrl": url} if ready[0] == 200 else {})
        await cloud.answer(send, (200, json.dumps({"models": listed}).encode(), {"content-type": "application/json"}))

    async def get(self, scope: Scope, send: Channel, name: str) -> None:
        if await self._refused(scope, send):
            return
        if name not in self.models:
            return await cloud.status(send, 404)
        body = json.dumps({"modelName": name, "modelUrl": self.models[name]}).encode()
        await cloud.answer(send, (200, body, {"content-type": "application/json"}))

    async def load(self, scope: Scope, receive: Channel, send: Channel) -> None:
        if await self._refused(scope, send):
            return
        try:
            request = json.loads(await _body(receive) or b"{}")
            name, url = str(request.get("model_name", "")), str(request.get("url", ""))
        except (ValueError, AttributeError) as exc:
            return await cloud.error(send, f"failed to parse the request JSON buffer: {exc}")
        if archive.forbidden(url):
            log.error('Invalid URL: %s. "url" property value cannot start with /dev/, /proc/, or /sys/.', url)
            return await cloud.status(send, 400)
        target = cloud.headers_of(scope).get(TARGET_HEADER) or name
        log.info("Loading SageMaker TargetModel: %s", target)
        async with self.lock:
            await cloud.answer(send, await self._load(scope, name, target, url))

    async def _load(self, scope: Scope, name: str, target: str, url: str) -> Answer:
        if (refusal := archive.invalid(url, self.root)) is not None:
            return _error(400, refusal)
        try:
            plan = await asyncio.to_thread(archive.plan, url, target, self.limit)
        except (archive.RepositoryNotFound, archive.Refused) as exc:
            return _error(400, str(exc))
        except OSError as exc:  # a file it may not read
            return _error(400, f"failed to read the model at '{url}': {exc.strerror or exc}")
        if plan.repository in self.models.values():
            return _error(409, f"model repository '{plan.repository}' has already been registered")
        if name in self.models:
            return _error(409, f"failed to register '{target}', there is a conflicting mapping for '{target}'")
        for model, parameters in plan.loads:
            body = await asyncio.to_thread(_load_body, parameters)  # megabytes of base64: off the loop
            reply = await cloud.ask(self.http, scope, "POST", f"/v2/repository/models/{model}/load", body)
            if reply[0] != 200:
                return failed(reply)
        self.models[name], self.targets[name] = plan.repository, target
        return 200, b"", {}

    async def unload(self, scope: Scope, send: Channel, name: str) -> None:
        if await self._refused(scope, send):
            return
        async with self.lock:
            if name not in self.models:
                return await cloud.status(send, 404)
            target = cloud.headers_of(scope).get(TARGET_HEADER) or self.targets[name]
            log.info("Unloading SageMaker TargetModel: %s", target)
            body = json.dumps({"parameters": {"unload_dependents": True}}).encode()
            reply = await cloud.ask(self.http, scope, "POST", f"/v2/repository/models/{target}/unload", body)
            if reply[0] != 200:
                return await cloud.answer(send, (400, reply[1], reply[2]))
            await self._unloaded(scope, target)
            del self.models[name], self.targets[name]
            await cloud.status(send, 200)

    async def _unloaded(self, scope: Scope, target: str) -> None:
        """Until the index says the model is unloaded (tritonserver polls it every 500 ms)."""
        deadline = time.monotonic() + UNLOAD_TIMEOUT_S
        while time.monotonic() < deadline:
            status, content, _ = await cloud.ask(self.http, scope, "POST", "/v2/repository/index", b"{}")
            entries = json.loads(content) if status == 200 else []
            if not any(e.get("name") == target and e.get("state") != "UNAVAILABLE" for e in entries):
                return
            await asyncio.sleep(0.5)
        log.error("Error: UNLOAD did not complete within expected %d seconds.", UNLOAD_TIMEOUT_S)

    def invoked(self, scope: Scope, name: str) -> str | None:
        """The model `/models/<name>/invoke` infers with; None: not loaded through `/models` (404)."""
        if name not in self.models:
            return None
        target = cloud.headers_of(scope).get(TARGET_HEADER) or name
        log.info("Invoking SageMaker TargetModel: %s", target)
        return target

    async def _refused(self, scope: Scope, send: Channel) -> bool:
        """The model repository restriction (`--http-restricted-api`), as the HTTP app decides it."""
        reply = await cloud.ask(self.http, scope, "POST", "/v2/repository/index", b"{}")
        if reply[0] != 403:
            return False
        await cloud.answer(send, reply)
        return True


def _load_body(parameters: dict[str, str]) -> bytes:
    return json.dumps({"parameters": parameters}).encode()


def _error(code: int, message: str) -> Answer:
    return code, json.dumps({"error": message}).encode(), {"content-type": "application/json"}


async def _body(receive: Channel) -> bytes:
    chunks, more = [], True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)

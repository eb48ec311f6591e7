"""URLs, readiness waits and model configs for the clients (tritonclient underneath)."""

from __future__ import annotations

import dataclasses
import time
import urllib.parse
from typing import Any

import numpy as np

from shoal.pytriton.client.exceptions import (
    PyTritonClientInvalidUrlError,
    PyTritonClientModelUnavailableError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from shoal.pytriton.model_config.parser import ModelConfigParser
from shoal.pytriton.model_config.triton_model_config import TritonModelConfig

_DEFAULT_NETWORK_TIMEOUT_S = 60.0
_DEFAULT_WAIT_FOR_MODEL_TIMEOUT_S = 60.0 * 5
_DEFAULT_PORTS = {"http": 8000, "grpc": 8001}
_POLL_S = 0.1


@dataclasses.dataclass
class TritonUrl:
    scheme: str
    hostname: str
    port: int

    @classmethod
    def from_url(cls, url: str) -> TritonUrl:
        """`host`, `host:port` or `scheme://host[:port]`; http by default, default ports 8000/8001."""
        if "://" not in url:
            url = f"http://{url}"
        parsed = urllib.parse.urlparse(url)
        scheme = parsed.scheme.lower()
        if scheme not in _DEFAULT_PORTS or not parsed.hostname:
            raise PyTritonClientInvalidUrlError(f"Invalid url {url}. Only grpc and http are supported.")
        return cls(scheme, parsed.hostname, parsed.port or _DEFAULT_PORTS[scheme])

    @property
    def without_scheme(self) -> str:
        return f"{self.hostname}:{self.port}"

    @property
    def with_scheme(self) -> str:
        return f"{self.scheme}://{self.without_scheme}"


def _ready(check: Any) -> bool:
    try:
        return bool(check())
    except Exception:  # not listening yet, or answering with an error: not ready
        return False


def wait_for_server_ready(client: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not (_ready(client.is_server_live) and _ready(client.is_server_ready)):
        if time.monotonic() >= deadline:
            raise PyTritonClientTimeoutError("Waiting for server to be ready timed out.")
        time.sleep(_POLL_S)


def wait_for_model_ready(client: Any, model_name: str, model_version: str | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    wait_for_server_ready(client, timeout_s)
    version = model_version or ""
    while not _ready(lambda: client.is_model_ready(model_name, version)):
        if time.monotonic() >= deadline:
            raise PyTritonClientTimeoutError(f"Waiting for model {model_name} to be ready timed out.")
        time.sleep(_POLL_S)


def parse_config(answer: Any) -> TritonModelConfig:
    """tritonclient's model config answer (HTTP: a dict; gRPC with as_json: {"config": {...}})."""
    config = answer.get("config", answer) if isinstance(answer, dict) else answer
    return ModelConfigParser.from_dict(config)


def get_model_config(client: Any, model_name: str, model_version: str | None, timeout_s: float) -> TritonModelConfig:
    wait_for_model_ready(client, model_name, model_version, timeout_s)
    try:
        kwargs = {"as_json": True} if "grpc" in type(client).__module__ else {}
        return parse_config(client.get_model_config(model_name, model_version or "", **kwargs))
    except Exception as exc:
        raise PyTritonClientModelUnavailableError(f"Model {model_name} is unavailable: {exc}") from exc


def verify_inputs_args(inputs: tuple, named_inputs: dict) -> None:
    if not inputs and not named_inputs:
        raise PyTritonClientValueError("Provide input data")
    if not bool(inputs) ^ bool(named_inputs):
        raise PyTritonClientValueError("Use either positional either keyword method arguments convention")


def verify_parameters(values: dict | None) -> None:
    if values is None:
        return
    if not isinstance(values, dict):
        raise PyTritonClientValueError("Parameters and headers must be a dictionary")
    for key, value in values.items():
        if not isinstance(key, str):
            raise PyTritonClientValueError("Parameter/header key must be a string")
        if not isinstance(value, (str, int, bool)):
            raise PyTritonClientValueError("Parameter/header value must be a string, integer or boolean")


def check_input(name: str, data: np.ndarray) -> None:
    if data.dtype == object and data.size and not isinstance(data.reshape(-1)[0], bytes):
        raise RuntimeError(
            f"Numpy array for {name!r} input with dtype=object should contain encoded strings (e.g. into utf-8). "
            f"Element type: {type(data.reshape(-1)[0])}"
        )
    if data.dtype.type == np.str_:
        raise RuntimeError(
            f"Unicode inputs are not supported. Encode numpy array for {name!r} input (ex. with np.char.encode(array, 'utf-8'))."
        )

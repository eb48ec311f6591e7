"""Requests to the cloud endpoints as Triton's qa tests send them (requests' raw bodies, built
with tritonclient's helpers) against qa's `addsub` model (tests/shoal/serving.py)."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import numpy as np
import tritonclient.http as httpclient

DATA = np.arange(16, dtype=np.int32).reshape(1, 16)


def post(url: str, body: bytes, headers: dict[str, str], method: str = "POST") -> tuple[int, Any, bytes]:
    """The status, the headers (case-insensitive) and the body of the answer."""
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def request_body(binary_input: bool = False, binary_output: bool = False) -> tuple[bytes, int | None]:
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(DATA, binary_data=binary_input)
    inputs[1].set_data_from_numpy(DATA, binary_data=False)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_output),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    return httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)


def check(content: bytes, header_length: int | None = None) -> None:
    result = httpclient.InferenceServerClient.parse_response_body(content, header_length=header_length)
    assert result.as_numpy("OUTPUT0").tolist() == (DATA * 2).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == np.zeros_like(DATA).tolist()

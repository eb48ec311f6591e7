"""The Vertex AI endpoint's pure parts: which KServe endpoint a redirect header reaches, and the
binary content type's header size, with tritonserver's texts (src/vertex_ai_server.cc)."""

from __future__ import annotations

import pytest

from services.gateway.http.vertex_ai import BINARY_MIME, header_length, redirected


@pytest.mark.parametrize(
    "path, answer",
    [
        ("/v2/models/m/infer", ("POST", "/v2/models/m/infer")),
        ("/v2/models/m/versions/2/infer", ("POST", "/v2/models/m/versions/2/infer")),
        ("/v2/models/m", ("GET", "/v2/models/m")),
        ("/v2/models/m/config", ("GET", "/v2/models/m/config")),
        ("/v2/models/m/ready", ("GET", "/v2/models/m/ready")),
        ("/v2/models/stats", ("GET", "/v2/models/stats")),
        ("/v2", ("GET", "/v2")),
        ("/v2/health/live", ("GET", "/v2/health/live")),
        ("/metrics", ("GET", "/metrics")),
        ("/v2/systemsharedmemory/status", ("GET", "/v2/systemsharedmemory/status")),
        ("/v2/cudasharedmemory/region/r/status", ("GET", "/v2/cudasharedmemory/region/r/status")),
        ("/v2/repository/index", ("POST", "/v2/repository/index")),
        ("/v2/systemsharedmemory/region/r/register", 403),  # changes need the HTTP endpoint itself
        ("/v2/repository/models/m/load", 403),
        ("/v2/repository/models/m/unload", 403),
        ("/v2/logging", 400),
        ("/elsewhere", 400),
    ],
)
def test_a_redirect_reaches_read_only_endpoints_only(path, answer):
    assert redirected(path) == answer


def test_the_binary_content_type_gives_the_json_header_size():
    assert header_length("application/json", 100) is None
    assert header_length(f"{BINARY_MIME}42", 100) == 42
    assert header_length(f"{BINARY_MIME}42abc", 100) == 42  # std::stoi reads the leading integer
    with pytest.raises(ValueError, match="expect MIME type for binary data starts with"):
        header_length(f"additional-string/{BINARY_MIME}42", 100)
    with pytest.raises(ValueError, match="Unable to parse inference header size, got: additional-string42"):
        header_length(f"{BINARY_MIME}additional-string42", 100)
    with pytest.raises(ValueError, match=r"inference header size should be in range \(0, 100\), got: 101"):
        header_length(f"{BINARY_MIME}101", 100)

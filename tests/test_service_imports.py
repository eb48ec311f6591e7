"""What each service process imports before it serves (docs/performance.md, "Start-up"): the
modules that only a rare path or another process needs stay out. In a fresh interpreter each."""

from __future__ import annotations

import subprocess
import sys

import pytest

# imported by no service at start: pydantic-settings (the settings read their variables themselves),
# tritonclient's gRPC client (Triton's messages come without it), grpcio's server (--grpc-server=grpcio)
NEVER = ["pydantic_settings", "tritonclient.grpc", "tritonclient.grpc._client", "services.gateway.grpc.grpcio_server"]
# and onnx only once an ONNX model is auto-completed, grpcio where the gateway's gRPC code needs it
ABSENT = {
    "gateway": NEVER + ["onnx"],
    "scheduler": NEVER + ["onnx", "grpc", "google.protobuf"],
    "worker": NEVER + ["onnx", "grpc"],
    "repository": NEVER + ["onnx", "grpc"],
}


@pytest.mark.parametrize("service", sorted(ABSENT))
def test_a_service_imports_only_what_it_serves_with(service: str) -> None:
    probe = (
        "import sys\nfrom shared.bus.nats_import import import_nats_without_websockets as f\nf()\n"
        f"import services.{service}.service\nprint(' '.join(m for m in {ABSENT[service]!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == [], f"{service} imports {out.stdout.split()} at start"

"""`shoal serve`'s Vertex AI flags, with tritonserver's defaults from Vertex AI's environment
(src/command_line_parser.cc): `AIP_MODE=PREDICTION` turns the endpoint on and the HTTP and gRPC
endpoints off unless the flags say otherwise, `AIP_HTTP_PORT` is its port (else 8080), and
`AIP_PREDICT_ROUTE` / `AIP_HEALTH_ROUTE` are its routes (services/gateway/http/vertex_ai.py)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from shared.process import settings as s

FLAGS = ["allow_vertex_ai", "vertex_ai_port", "vertex_ai_default_model"]


def add_flags(p: argparse.ArgumentParser) -> None:
    for name in FLAGS:  # None: not given, so that Vertex AI's environment decides
        s.add_setting(p, "--" + name.replace("_", "-"), s.GatewaySettings, name, default=None)


def check(args: argparse.Namespace, argv: list[str]) -> None:
    """Fill the Vertex AI settings in from the environment; stop, in tritonserver's words, when the
    endpoint is asked for and a route is missing."""
    prediction = os.environ.get("AIP_MODE", "") == "PREDICTION"
    if args.allow_vertex_ai is None:
        args.allow_vertex_ai = prediction
    if prediction and args.allow_http is None:
        args.allow_http = False
    if prediction and not any(arg.split("=", 1)[0] == "--allow-grpc" for arg in argv):
        args.allow_grpc = False
    if args.vertex_ai_port is None:
        args.vertex_ai_port = int(os.environ.get("AIP_HTTP_PORT", "8080"))
    args.vertex_ai_default_model = args.vertex_ai_default_model or ""
    args.vertex_ai_predict_route = os.environ.get("AIP_PREDICT_ROUTE", "")
    args.vertex_ai_health_route = os.environ.get("AIP_HEALTH_ROUTE", "")
    if not args.allow_vertex_ai:
        return
    if not args.vertex_ai_predict_route:  # (sic) tritonserver's text
        raise SystemExit(
            "shoal serve: failed to start Vertex AI service: API_PREDICT_ROUTE is not defined for Vertex AI endpoint"
        )
    if not args.vertex_ai_health_route:
        raise SystemExit(
            "shoal serve: failed to start Vertex AI service: AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint"
        )


def gateway_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The gateway's Vertex AI settings from the checked flags."""
    names = [*FLAGS, "vertex_ai_predict_route", "vertex_ai_health_route"]
    return {name: getattr(args, name) for name in names}

"""`shoal serve`'s SageMaker flags (tritonserver's src/command_line_parser.cc) and the settings
SageMaker's environment gives the endpoint (src/sagemaker_server.h): the model
(`SAGEMAKER_TRITON_DEFAULT_MODEL_NAME`), the route `/invocations` answers as
(`SAGEMAKER_TRITON_INFERENCE_TYPE`) and the health `/ping` answers as (`SAGEMAKER_TRITON_PING_MODE`)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from services.gateway.http.sagemaker import INFERENCE_TYPES
from shared.process import settings as s

FLAGS = ["allow_sagemaker", "sagemaker_port", "sagemaker_models_root"]
FROM_ENVIRONMENT = {
    "sagemaker_model": ("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"),
    "sagemaker_inference_type": ("SAGEMAKER_TRITON_INFERENCE_TYPE", "infer"),
    "sagemaker_ping_mode": ("SAGEMAKER_TRITON_PING_MODE", "ready"),
}


def add_flags(p: argparse.ArgumentParser) -> None:
    for name in FLAGS:
        s.add_setting(p, "--" + name.replace("_", "-"), s.GatewaySettings, name)
    p.add_argument(
        "--sagemaker-safe-port-range",
        default=None,
        metavar="<start>-<end>",
        help="the ports every other endpoint on the SageMaker endpoint's address must use (default: any)",
    )


def check(args: argparse.Namespace) -> None:
    """The environment's settings; stop, in tritonserver's words, on an unknown inference type or an
    endpoint outside the safe port range."""
    for name, (variable, default) in FROM_ENVIRONMENT.items():
        setattr(args, name, os.environ.get(variable, default))
    if not args.allow_sagemaker:
        return
    if args.sagemaker_inference_type not in INFERENCE_TYPES:
        raise SystemExit(
            f"shoal serve: Server has invalid inference type '{args.sagemaker_inference_type}'. "
            "Must be one of: infer, generate, generate_stream."
        )
    if args.sagemaker_safe_port_range is not None:
        _check_range(args, args.sagemaker_safe_port_range)


def _check_range(args: argparse.Namespace, text: str) -> None:
    low, _, high = text.partition("-")
    if not (low.strip().isdigit() and high.strip().isdigit()):
        raise SystemExit(f"shoal serve: --sagemaker-safe-port-range expects <start>-<end>, got '{text}'")
    first, last = int(low), int(high)
    for name, address, port in _others(args):
        if address == args.http_address and not first <= port <= last:
            raise SystemExit(
                f"shoal serve: The server cannot listen to {name} requests at port {port}, "
                f"allowed port range is [{first}, {last}]"
            )


def _others(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """The other endpoints, named as tritonserver names them in that check."""
    others = []
    if args.allow_http is not False:
        others.append(("HTTP", args.http_address, args.http_port))
    if args.allow_grpc:
        others.append(("GRPC", args.grpc_address, args.grpc_port))
    if args.allow_metrics:
        others.append(("metrics", args.metrics_address or args.http_address, args.metrics_port))
    if args.allow_vertex_ai:
        others.append(("Vertex AI", args.http_address, args.vertex_ai_port))
    return others


def gateway_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The gateway's SageMaker settings from the checked flags."""
    return {name: getattr(args, name) for name in [*FLAGS, *FROM_ENVIRONMENT]}

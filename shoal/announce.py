"""What `shoal serve` tells its user once the models are loaded, in tritonserver's words: the model
table and the services started."""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger("shoal.serve")  # the supervisor's


def model_table(index: list[dict]) -> str:
    rows = [
        (e["name"], e.get("version", "-"), e["state"] + (f": {e['reason']}" if e.get("reason") else ""))
        for e in index
        if "state" in e
    ]  # models never loaded (explicit mode) are not listed, as in Triton; a name several
    # repositories hold is, with no version (Triton only logs it)
    heads = ("Model", "Version", "Status")
    widths = [max(len(str(x)) for x in col) for col in zip(heads, *rows)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    fmt = "| " + " | ".join(f"{{:<{w}}}" for w in widths) + " |"
    return "\n".join([line, fmt.format(*heads), line, *(fmt.format(*map(str, r)) for r in rows), line])


def started(args: argparse.Namespace) -> None:
    """tritonserver's lines, once the models are loaded."""
    if args.allow_grpc:
        log.info("Started GRPCInferenceService at %s:%d", args.grpc_address, args.grpc_port)
    if args.allow_http is not False:
        log.info("Started HTTPService at %s:%d", args.http_address, args.http_port)
    if args.allow_sagemaker:
        log.info("Started Sagemaker HTTPService at %s:%d", args.http_address, args.sagemaker_port)
    if args.allow_vertex_ai:
        log.info("Started Vertex AI HTTPService at %s:%d", args.http_address, args.vertex_ai_port)
    if args.allow_metrics:
        log.info("Started Metrics Service at %s:%d", args.metrics_address or args.http_address, args.metrics_port)
    if args.openai_port:
        log.info("Started OpenAI-compatible API at %s:%d", args.openai_address or args.http_address, args.openai_port)

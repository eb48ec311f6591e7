"""Every tritonserver flag Shoal does not implement, and what `shoal serve` answers to it.

A tritonserver launch script never meets argparse's "unrecognized arguments": each of
tritonserver's flags (its src/command_line_parser.cc; the table in docs/serving.md) is
implemented, or listed here. A flag that only tunes a part Shoal does not have (thread pools,
memory pools, GPU settings) is accepted and said to change nothing, in one warning line at
start; a flag that asks for a feature Shoal lacks is refused by name with the reason.
"""

from __future__ import annotations

import argparse

# accepted, with a warning at start: flag -> why it changes nothing here
NO_EFFECT = {
    "--grpc-infer-thread-count": "the gRPC endpoint is one event loop; scale out with --gateways",
    "--http-thread-count": "the HTTP endpoint is one event loop; scale out with --gateways",
    "--grpc-max-response-pool-size": "Python allocates each gRPC response; there is no pool to size",
    "--grpc-infer-allocation-pool-size": "the gRPC server builds each request's state and response anew; "
    "there is no pool of them to keep",
    "--buffer-manager-thread-count": "tensors are copied by the process that reads them; there is no buffer manager",
    "--pinned-memory-pool-byte-size": "Shoal has no pinned memory pool (tensors travel in POSIX shared memory)",
    "--cuda-memory-pool-byte-size": "Shoal has no CUDA memory pool (each backend allocates its own device memory)",
    "--cuda-virtual-address-size": "Shoal has no CUDA memory pool",
    "--enable-peer-access": "Shoal does not set up CUDA peer access between GPUs",
    "--min-supported-compute-capability": "Shoal does not filter GPUs by compute capability",
    "--metrics-interval-ms": "the CPU, memory and GPU gauges are read when /metrics is scraped",
    "--model-load-gpu-limit": "GPU memory limits on load are not implemented; --model-memory-budget limits memory",
    "--cache-directory": "Shoal reads local model repositories only; there is no remote repository cache",
    "--grpc-max-connection-age": "Shoal's gRPC server does not age connections out",
    "--grpc-max-connection-age-grace": "Shoal's gRPC server does not age connections out",
    "--sagemaker-thread-count": "the SageMaker endpoint is one event loop, in the gateway",
    "--vertex-ai-thread-count": "the Vertex AI endpoint is one event loop, in the gateway",
    "--host-policy": "instances are not bound to NUMA nodes or CPU cores: they run where the OS schedules "
    "them, and an instance_group's host_policy is not looked up",
    "--repoagent-directory": "repository agents are built in (checksum) and no agent library is loaded "
    "from this directory; a model asking for another agent fails to load",
}

# refused by name: flag -> why (none today; kept for a flag whose feature Shoal cannot stand in for)
REFUSED: dict[str, str] = {}


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that have no effect, so that argparse knows them."""
    for flag, why in NO_EFFECT.items():
        parser.add_argument(
            flag, nargs="?", const="", default=None, metavar="VALUE", help=f"accepted, no effect: {why} (default: none)"
        )


def refuse(argv: list[str]) -> None:
    """Stop at the first flag Shoal refuses, naming it and why."""
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag in REFUSED:
            raise SystemExit(f"shoal serve: {flag} is not supported: {REFUSED[flag]}")


def check(args: argparse.Namespace) -> list[str]:
    """The warnings for the flags that change nothing."""
    warnings = []
    for flag, why in NO_EFFECT.items():
        value = getattr(args, _dest(flag))
        if value is not None:
            shown = f"{flag}={value}" if value else flag
            warnings.append(f"{shown} has no effect in Shoal: {why}")
    return warnings


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")

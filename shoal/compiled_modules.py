"""Which build this is: the modules compiled by mypyc in a non-editable install, listed once.

`setup.py` reads `COMPILED` (it loads this file by path, so nothing here may import the project or
a third-party package) and compiles those modules with mypyc when a C compiler is present, the
install is not editable and `SHOAL_PURE` is unset; otherwise the same modules install as plain
Python. `shoal serve` and every service log `describe()` once at start (docs/performance.md,
"The compiled build").

A module joins the list only if mypyc accepts it and it behaves the same compiled: no async
generators (mypyc refuses them), no attributes added to its classes from outside, nothing that
monkeypatches it at run time.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util

# the per-request path, by process: one list, all compiled or none (they share one support module)
COMPILED: tuple[str, ...] = (
    # gateway: the HTTP and gRPC codecs and the /infer handler
    "services/gateway/http/codec.py",
    "services/gateway/http/infer.py",
    "services/gateway/http/json_data.py",
    "services/gateway/grpc/convert.py",
    "services/gateway/tensor_limits.py",
    "services/gateway/grpc/http2/frames.py",
    "services/gateway/grpc/http2/header_blocks.py",
    # the inference core (its streaming generators are inference/streams.py, not compiled)
    "inference/core.py",
    "inference/forward.py",
    "inference/cache.py",
    "inference/classification.py",
    "inference/models.py",
    "inference/sequence_params.py",
    "inference/replica_statistics.py",
    "inference/trace.py",
    "inference/types.py",
    "inference/validation.py",
    # the wire and bus helpers every process calls per message
    "shared/wire/subjects.py",
    "shared/bus/dispatch.py",  # its stream generator: shared/bus/dispatch_stream.py
    "shared/bus/eager.py",
    "shared/bus/hot_path.py",
    "shared/bus/tensor_store.py",
    "shared/bus/holders.py",
    "shared/config/datatypes.py",
    # the scheduler's batching
    "services/scheduler/scheduling_records.py",
    "services/scheduler/cohosted.py",
    "services/scheduler/service.py",
    "services/scheduler/tasks.py",
    "services/scheduler/acknowledgements.py",
    "services/scheduler/replicas/leases.py",
    "services/scheduler/replicas/ownership.py",
    "services/scheduler/discipline_factory.py",
    "services/scheduler/batching/answers.py",
    "services/scheduler/batching/batch_spans.py",
    "services/scheduler/batching/credits.py",
    "services/scheduler/batching/discipline.py",
    "services/scheduler/batching/dynamic.py",
    "services/scheduler/batching/flights.py",
    "services/scheduler/batching/formation.py",
    "services/scheduler/batching/model_queue.py",
    "services/scheduler/batching/ordering.py",
    "services/scheduler/batching/prefetch.py",
    "services/scheduler/batching/pump.py",
    "services/scheduler/batching/queues.py",
    "services/scheduler/batching/ratelimit.py",
    "services/scheduler/statistics/latency.py",
    "services/scheduler/statistics/stats.py",
    # the worker's batch path (the python model's instance process runs it too)
    "services/worker/batches/batch_executor.py",
    "services/worker/batches/batch_run.py",
    "services/worker/batches/completions.py",
    "services/worker/batches/instance_thread.py",
    "services/worker/batches/instances.py",
    "services/worker/batches/response_outputs.py",
    "services/worker/batches/replies.py",
    "services/worker/service.py",
)


def module_names() -> list[str]:
    return [path.removesuffix(".py").replace("/", ".") for path in COMPILED]


def mypy_config() -> str:
    """mypy's settings for compiling (setup.py), the same on every machine: third-party packages are
    Any (the installing environment may not hold them yet: pip builds the wheel before it installs
    the dependencies), and only the compiled modules must type-check; `mypy` in CI checks everything
    with the dependencies' own types."""
    return (
        "[mypy]\nno_site_packages = True\nignore_missing_imports = True\n"
        "disable_error_code = unused-ignore, no-any-return\n"
        "[mypy-shoal.*,shared.*,services.*,inference.*]\nignore_errors = True\n"
        f"[mypy-{','.join(module_names())}]\nignore_errors = False\n"
    )


def compiled_modules() -> list[str]:
    """The listed modules that import as compiled extensions here (found, not imported)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    compiled = []
    for name in module_names():
        spec = importlib.util.find_spec(name)
        if spec is not None and (spec.origin or "").endswith(suffixes):
            compiled.append(name)
    return compiled


def describe() -> str:
    """One line for the log: which build runs."""
    compiled, listed = len(compiled_modules()), len(COMPILED)
    if compiled == listed:
        return f"build: compiled (mypyc, {compiled} modules)"
    if compiled == 0:
        return "build: pure Python (an editable install, SHOAL_PURE set, or no C compiler at install time)"
    return f"build: mixed, {compiled} of {listed} listed modules compiled (a stale install?)"

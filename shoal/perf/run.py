"""One measurement from options to results: the API `shoal perf` and `shoal analyze` share."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from shoal.perf.inputs import build_steps
from shoal.perf.load_generator import Engine, OnWindow
from shoal.perf.measure import LevelResult
from shoal.perf.options import PerfOptions
from shoal.perf.shm_regions import SystemShm
from shoal.perf.transport import open_transport

T = TypeVar("T")


async def measure(
    options: PerfOptions,
    on_window: OnWindow | None = None,
    on_level: Callable[[LevelResult], None] | None = None,
) -> list[LevelResult]:
    transport = open_transport(
        options.protocol,
        options.url,
        options.model,
        options.model_version,
        options.request_timeout_s,
        options.streaming,
    )
    regions: SystemShm | None = None
    try:
        info = await transport.model_info()
        steps = build_steps(info, options.shapes, options.input_data, options.batch_size)
        if options.shared_memory == "system":
            regions = SystemShm(transport)
            steps = await regions.place(steps, info, options.batch_size, options.output_shm_size)
        transport.prepare(steps)
        return await Engine(transport, steps, options).run(on_window, on_level)
    finally:
        if regions is not None:
            await regions.close()
        await transport.close()


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on uvloop where it is installed (it comes with uvicorn[standard]): less client overhead."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from shoal.llm.engine import Decoder, Engine, Limits


@pytest.fixture
def engine_for() -> Iterator[Callable[[Decoder, Limits], Engine]]:
    """Engines over a fake model, closed after the test."""
    engines: list[Engine] = []

    def make(model: Decoder, limits: Limits) -> Engine:
        engines.append(Engine(model, limits))
        return engines[-1]

    yield make
    for engine in engines:
        engine.close()

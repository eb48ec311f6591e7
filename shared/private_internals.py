"""What a fence around a library's private internals checks: that the installed version still has
them. A fence (shared/bus/nats_internals.py for nats-py, services/gateway/http/protocol.py for
uvicorn) lists the private names it uses by class, and the code of the library's that must still
do what it expects; its test asserts `missing(...) == []`, which names what an upgrade removed."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

Behaviour = tuple[Callable[..., Any], str]  # a function of the library's, and text its code must contain


def missing(relied_on: Mapping[type, Iterable[str]], behaviour: Iterable[Behaviour] = ()) -> list[str]:
    """What the installed library lacks, by name: an attribute of `relied_on` that is neither one
    of its class's nor one its code sets on `self`, and each `behaviour` whose text is gone."""
    absent = []
    for owner, names in relied_on.items():
        source = inspect.getsource(owner)
        for name in names:
            if not hasattr(owner, name) and f"self.{name} " not in source and f"self.{name}:" not in source:
                absent.append(f"{owner.__module__}.{owner.__qualname__}.{name}")
    for function, text in behaviour:
        if text not in inspect.getsource(function):
            absent.append(f"{function.__module__}.{function.__qualname__} no longer does `{text}`")
    return absent

"""shared/bus/nats_internals.py, the fence around nats-py's private internals: the installed
nats-py has everything the fence relies on, and an upgrade that removes any of it fails here,
naming it (the hot path's own tests would fail too, but with a symptom, not the cause)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription

from shared.bus import nats_internals

ROOT = Path(__file__).resolve().parents[3]


def test_the_installed_nats_py_has_what_the_fence_relies_on():
    assert nats_internals.missing() == []


def test_a_nats_py_without_it_is_named(monkeypatch):
    relied_on = {**nats_internals.RELIED_ON, Subscription: ("_pending_queue", "_gone_in_a_later_release")}
    behaviour = (*nats_internals.BEHAVIOUR, (NATS._process_msg, "sub._a_changed_hand_off(msg)"))
    monkeypatch.setattr(nats_internals, "RELIED_ON", relied_on)
    monkeypatch.setattr(nats_internals, "BEHAVIOUR", behaviour)
    assert nats_internals.missing() == [
        "nats.aio.subscription.Subscription._gone_in_a_later_release",
        "nats.aio.client.Client._process_msg no longer does `sub._a_changed_hand_off(msg)`",
    ]


def private_attributes(path: Path) -> set[str]:
    """The `_names` a module uses off other objects than `self` and `cls`, less those its own
    classes define (a class of its own reading another instance's `_name` is its business)."""
    used, own = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                own.add(node.attr)
            else:
                used.add(node.attr)
    return used - own


@pytest.mark.parametrize("package", ["shared", "services", "inference", "shoal"])
def test_no_module_outside_the_fence_touches_what_it_guards(package):
    guarded = {name for names in nats_internals.RELIED_ON.values() for name in names}
    fence = ROOT / "shared" / "bus" / "nats_internals.py"
    offenders = {
        f"{path.relative_to(ROOT)}: {sorted(touched)}"
        for path in (ROOT / package).rglob("*.py")
        if path != fence and (touched := private_attributes(path) & guarded)
    }
    assert offenders == set()

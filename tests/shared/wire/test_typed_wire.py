"""Every bus message is a Struct of shared/wire/ (issue 29): no service decodes a message without
its type, or sends a dict, list or hand-made JSON where a Struct belongs. This reads the source."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("services", "shared", "inference", "shoal")
DECODERS = {"decode", "Decoder"}
ENCODERS = {"encode"}
SENDS = {"publish", "respond", "request", "put", "create", "update"}
UNTYPED = (ast.Dict, ast.DictComp, ast.List, ast.ListComp, ast.JoinedStr)
# modules whose msgspec/json calls read or write documents that are not bus messages
NOT_THE_BUS = {
    "services/gateway/http/codec.py",  # clients' HTTP bodies
    "services/gateway/openai/openai_app.py",
    "inference/cache.py",  # a response-cache key's hash input
}


def sources() -> Iterator[tuple[str, ast.Module]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            if name not in NOT_THE_BUS:
                yield name, ast.parse(path.read_text(), name)


def is_msgspec(node: ast.expr) -> bool:
    """`msgspec.json.X` or `msgspec.msgpack.X`."""
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "msgspec"
        and node.value.attr in ("json", "msgpack")
    )


def untyped_decodes(tree: ast.Module) -> Iterator[int]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and is_msgspec(node.func) and node.func.attr in DECODERS:  # type: ignore[attr-defined]
            typed = any(k.arg == "type" for k in node.keywords) or (node.func.attr == "Decoder" and node.args)  # type: ignore[attr-defined]
            if not typed:
                yield node.lineno


def untyped_sends(tree: ast.Module) -> Iterator[int]:
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ENCODERS and node.args and isinstance(node.args[0], UNTYPED):
            yield node.lineno  # encode({...}): a dict where a Struct belongs
        if name in SENDS and isinstance(func, ast.Attribute):
            payloads = node.args if func.attr == "respond" else node.args[1:]
            for arg in payloads + [k.value for k in node.keywords if k.arg in ("payload", "value", "data")]:
                if hand_made_json(arg):
                    yield node.lineno


def hand_made_json(node: ast.expr) -> bool:
    """`json.dumps(...)`, `json.dumps(...).encode()` or `orjson.dumps(...)` as a payload."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "encode" and isinstance(node.func.value, ast.Call):
            return hand_made_json(node.func.value)
        target = node.func.value
        return node.func.attr == "dumps" and isinstance(target, ast.Name) and target.id in ("json", "orjson")
    return False


def test_every_bus_decode_names_its_struct():
    found = [f"{name}:{line}" for name, tree in sources() for line in untyped_decodes(tree)]
    assert found == [], f"decoded without a type: {found}"


def test_no_message_is_sent_as_a_dict_or_hand_made_json():
    found = [f"{name}:{line}" for name, tree in sources() for line in untyped_sends(tree)]
    assert found == [], f"sent untyped: {found}"


def test_the_checks_find_what_they_look_for():
    assert list(untyped_decodes(ast.parse("msgspec.json.decode(data)"))) == [1]
    assert list(untyped_decodes(ast.parse("msgspec.msgpack.Decoder()"))) == [1]
    assert list(untyped_decodes(ast.parse("msgspec.json.decode(data, type=X)\nmsgspec.msgpack.Decoder(X)"))) == []
    assert list(untyped_sends(ast.parse('msgspec.json.encode({"worker": w})'))) == [1]
    assert list(untyped_sends(ast.parse("await nc.publish(s, json.dumps(doc).encode())"))) == [1]
    assert list(untyped_sends(ast.parse("await msg.respond(orjson.dumps(doc))"))) == [1]
    assert list(untyped_sends(ast.parse("await nc.publish(s, encode(Struct(1)))"))) == []

"""The llama.cpp grammar that makes a model call a tool (OpenAI's `tool_choice` "required" or a
named function): its output can only be one or more calls in the form the prompt shows,
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (shared/config/tool_prompt.py),
each naming one of the functions with arguments that follow that function's JSON schema.

With `tool_choice` "auto" the same calls are the rest of the answer once the model has started
one: a lazy grammar (`LazyGrammar`) that joins the sampler when the text ends with the call's
opening, so free text stays free and a started call always parses and validates.

The call's JSON comes from llama-cpp-python's schema converter, as `response_format` does, over a
schema with one alternative per function (its name a constant, its parameters the arguments'
schema), name first so that a stream can show the name before the arguments. The parameters'
`$defs` (and `definitions`, pydantic's forms) move to that schema's root, where their
`#/$defs/...` references point.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable
from typing import Any

from shared.config.tool_prompt import CALL_CLOSE, CALL_OPEN
from shoal.llm.llama_c_api import LazyGrammar
from shoal.llm.response_grammar import grammar_for, json_schema_grammar

log = logging.getLogger("shoal.llm")
# GBNF's tokens: a string literal, a character class, a comment, a name (rules' names are made of
# these characters, so no escaping can keep a schema's names from being this module's), anything else
_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|#[^\n]*|[A-Za-z0-9-]+|.', re.DOTALL)
_DEFINED = re.compile(r"^([A-Za-z0-9-]+) ::=", re.MULTILINE)
_JSON = "j-"  # the converter's rules' prefix; no rule of this module's starts with it
OPENING = CALL_OPEN + "\n"  # a call's start, as the prompt shows it


_DEFINITIONS = ("$defs", "definitions")


def call_schema(tools: list[dict[str, Any]], choice: Any) -> dict[str, Any]:
    """The JSON schema of one call: to any of `tools` ("required"), or to the one named."""
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    chosen = [tool["function"] for tool in tools if named is None or tool["function"]["name"] == named]
    if not chosen:
        raise ValueError(f"tool_choice names '{named}', which is not among the tools")
    hoisted: dict[str, dict[str, Any]] = {}
    alternatives = [
        {
            "type": "object",
            "properties": {
                "name": {"const": function["name"]},
                "arguments": _anchored(
                    function, _hoist(_lifted(function.get("parameters") or {"type": "object"}), hoisted), hoisted
                ),
            },
            "required": ["name", "arguments"],
        }
        for function in chosen
    ]
    schema = alternatives[0] if len(alternatives) == 1 else {"oneOf": alternatives}
    return schema | hoisted


def _lifted(parameters: dict[str, Any]) -> dict[str, Any]:
    """`parameters` with each reference that runs through a list (`#/properties/x/anyOf/0`)
    pointing at a copy of its target in their `$defs`: the converter walks a reference by keys
    only. A target that refers elsewhere into the parameters is left as it was (the converter then
    refuses the schema, and `auto` runs unguided)."""
    lifted: dict[str, str] = {}  # reference -> the definition made for it
    definitions = dict(parameters.get("$defs") or {})

    def visit(node: Any) -> Any:
        if isinstance(node, list):
            return [visit(item) for item in node]
        if not isinstance(node, dict):
            return node
        out = {key: visit(value) for key, value in node.items()}
        ref = node.get("$ref")
        if isinstance(ref, str) and ref not in lifted and _local(ref):
            target = _through_list(parameters, ref)
            if target is not None:
                name = "-".join(ref[2:].split("/"))
                while name in definitions:
                    name += "_"
                lifted[ref], definitions[name] = name, {}  # named first: a target may refer to itself
                copy = visit(target)
                if _self_references(copy):
                    del lifted[ref], definitions[name]
                else:
                    definitions[name] = copy
        if ref in lifted:
            out["$ref"] = f"#/$defs/{lifted[ref]}"
        return out

    visited = visit(parameters)
    return visited | {"$defs": definitions} if lifted else parameters


def _through_list(root: Any, ref: str) -> Any:
    """The target of a local reference (a JSON pointer) that runs through a list, else None."""
    node, crossed = root, False
    for part in ref[2:].split("/") if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node, crossed = node[int(part)], True
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return node if crossed else None


def _anchored(function: dict[str, Any], parameters: dict[str, Any], hoisted: dict[str, dict[str, Any]]) -> Any:
    """`parameters`, or where they refer into themselves (`#`, `#/properties/...`), a reference to
    them moved into the root's definitions, their references pointing there (the converter walks
    a reference by keys: it cannot reach the parameters through `oneOf`'s list)."""
    if not _self_references(parameters):
        return parameters
    definitions = hoisted.setdefault("$defs", {})
    name = f"{function['name']}-parameters"
    while name in definitions:
        name += "_"
    where = f"#/$defs/{name}"
    definitions[name] = _moved(parameters, where)
    return {"$ref": where}


def _self_references(node: Any) -> bool:
    if isinstance(node, list):
        return any(_self_references(item) for item in node)
    if not isinstance(node, dict):
        return False
    return _local(node.get("$ref")) or any(_self_references(value) for value in node.values())


def _local(ref: Any) -> bool:
    """A reference into the parameters themselves, not into their (hoisted) definitions."""
    return (
        isinstance(ref, str)
        and (ref == "#" or ref.startswith("#/"))
        and not any(ref.startswith(f"#/{key}/") for key in _DEFINITIONS)
    )


def _moved(node: Any, where: str) -> Any:
    """`node` with its references into itself pointing at `where`, where it now is."""
    return _with_refs(node, lambda ref: where + ref[1:] if _local(ref) else None)


def _with_refs(node: Any, rewrite: Callable[[str], str | None]) -> Any:
    """`node` with each `$ref` that `rewrite` gives a new value (None: kept) replaced."""
    if isinstance(node, list):
        return [_with_refs(item, rewrite) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _with_refs(value, rewrite) for key, value in node.items()}
    ref = node.get("$ref")
    new = rewrite(ref) if isinstance(ref, str) else None
    if new is not None:
        out["$ref"] = new
    return out


def _hoist(parameters: dict[str, Any], hoisted: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`parameters` without its definitions, which join `hoisted` (the root's): a reference
    `#/$defs/X` is read from the root of the whole schema. A name two functions define
    differently is renamed in the later one, its references with it."""
    renamed: dict[str, str] = {}
    for key in _DEFINITIONS:
        theirs = hoisted.get(key, {})
        for name, definition in (parameters.get(key) or {}).items():
            new = name
            while new in theirs and theirs[new] != definition:
                new += "_"
            if new != name:
                renamed[f"#/{key}/{name}"] = f"#/{key}/{new}"
    if renamed:
        parameters = _rename(parameters, renamed)
    for key in _DEFINITIONS:
        mine = parameters.get(key) or {}
        for name, definition in mine.items():
            hoisted.setdefault(key, {})[renamed.get(f"#/{key}/{name}", f"#/{key}/{name}").split("/")[-1]] = definition
    return {key: value for key, value in parameters.items() if key not in _DEFINITIONS}


def _rename(node: Any, renamed: dict[str, str]) -> Any:
    """`node` with its references to renamed definitions (or into them) pointing at the new names."""

    def rewrite(ref: str) -> str | None:
        old = next((old for old in renamed if ref == old or ref.startswith(old + "/")), None)
        return None if old is None else renamed[old] + ref[len(old) :]

    return _with_refs(node, rewrite)


def _rules(tools: list[dict[str, Any]], choice: Any) -> str:
    """The rules of one call (`tool-call`) and of its JSON (`j-root`), without a root."""
    call = prefixed(json_schema_grammar(call_schema(tools, choice), ["name", "arguments"]), _JSON)
    return f"tool-call ::= {json.dumps(OPENING)} {_JSON}root {json.dumps(chr(10) + CALL_CLOSE)}\n{call}"


def prefixed(grammar: str, prefix: str) -> str:
    """`grammar` with every rule it defines renamed `prefix` + name, references with them: the
    converter names rules after the schema's `$defs` and properties (a definition `tool-call`, or
    `tool` with a property `call`), which must not redefine this module's rules."""
    defined = set(_DEFINED.findall(grammar))
    return "".join(prefix + token if token in defined else token for token in _TOKEN.findall(grammar))


def tool_grammar(tools: list[dict[str, Any]], choice: Any, parallel: bool = True) -> str:
    """The GBNF (root rule `root`) for calls to `tools` as `choice` asks; `parallel` false: one."""
    root = 'root ::= tool-call ("\\n" tool-call)*' if parallel else "root ::= tool-call"
    return f"{root}\n{_rules(tools, choice)}"


def lazy_tool_grammar(tools: list[dict[str, Any]], parallel: bool = True) -> LazyGrammar:
    """`tool_choice` "auto": the grammar of what follows a started call, for each way the text may
    end when the call has started: `<tool_call` (the `>` is then forced too, so no token that
    carries more than `>` can slip by it), `<tool_call>`, `<tool_call>\\n`. The longest first.
    Kept for the latest tools (a client sends the same ones with each turn): converting ten
    schemas takes milliseconds, on every request."""
    return _lazy(json.dumps(tools, sort_keys=True), parallel)


@functools.lru_cache(maxsize=32)
def _lazy(tools_json: str, parallel: bool) -> LazyGrammar:
    tools = json.loads(tools_json)
    rules, more = _rules(tools, "required"), ' ("\\n" tool-call)*' if parallel else ""
    close = json.dumps(chr(10) + CALL_CLOSE)
    openings = []
    for cut in range(len(OPENING), len(CALL_OPEN) - 2, -1):
        rest = f"{json.dumps(OPENING[cut:])} " if cut < len(OPENING) else ""
        openings.append((OPENING[:cut], f"root ::= {rest}{_JSON}root {close}{more}\n{rules}"))
    return LazyGrammar(tuple(openings), names(tools))


def request_grammar(
    tools: list[dict[str, Any]] | None, choice: Any, parallel: bool, response_format: Any
) -> str | LazyGrammar:
    """A request's grammar: the one that forces a call when `tool_choice` asks for one; with tools
    and `auto` (or none given) the lazy one, or none when the tools' schemas cannot be converted
    (the call then runs unguided, as before tools had a grammar); else `response_format`'s."""
    asks_tools = choice != "none" and (bool(tools) or choice not in (None, "auto"))
    if asks_tools and grammar_for(response_format):  # as the gateway refuses it
        raise ValueError("response_format with tools: a reply is either a call or the formatted content")
    if not asks_tools:
        return grammar_for(response_format)
    if not tools:
        raise ValueError("tool_choice asks for a call, and no tools were given")
    if choice not in (None, "auto"):
        return tool_grammar(tools, choice, parallel)
    try:
        return lazy_tool_grammar(tools, parallel)
    except Exception as exc:  # noqa: BLE001 - the converter's AssertionError, ValueError, ...
        _unguided(names(tools), str(exc))
        return ""


@functools.lru_cache(maxsize=32)
def _unguided(tool_names: str, reason: str) -> None:
    """The warning once for these tools and reason, not on every request: a client sends the same
    tools with each turn (the latest 32 are remembered)."""
    log.warning("tool_choice auto: no grammar for the tools %s, calls run unguided: %s", tool_names, reason)


def names(tools: list[dict[str, Any]]) -> str:
    return ", ".join(str(tool.get("function", {}).get("name")) for tool in tools)

"""shoal/llm/tool_grammar.py: the grammar that forces a tool call (needs llama-cpp-python, the
llm extra, for its schema converter); the real model follows it in test_openai_llm.py."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp", reason="needs the llm extra: pip install '.[llm]'")
pytestmark = pytest.mark.llm

from shoal.llm.tool_grammar import call_schema, tool_grammar  # noqa: E402

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
NOW = {"type": "function", "function": {"name": "now"}}


def rules(grammar: str) -> dict[str, str]:
    return dict(line.split(" ::= ", 1) for line in grammar.splitlines())


def test_required_is_any_of_the_functions_and_several_calls_in_parallel():
    grammar = rules(tool_grammar([WEATHER, NOW], "required"))
    assert grammar["root"] == 'tool-call ("\\n" tool-call)*'
    assert grammar["tool-call"] == '"<tool_call>\\n" j-root "\\n</tool_call>"'
    assert grammar["j-root"] == "j-alternative-0 | j-alternative-1"
    assert grammar["j-alternative-0-name"] == '"\\"get_weather\\""' and grammar["j-alternative-1-name"] == '"\\"now\\""'
    assert 'j-space ":" j-space j-string' in grammar["j-alternative-0-arguments-city-kv"]  # the schema's argument


def test_a_named_function_is_the_only_one_and_without_parallel_calls_one_call():
    grammar = rules(tool_grammar([WEATHER, NOW], {"type": "function", "function": {"name": "now"}}, False))
    assert grammar["root"] == "tool-call" and grammar["j-name"] == '"\\"now\\""'
    assert grammar["j-root"].startswith('"{" j-space j-name-kv "," j-space j-arguments-kv')  # the name first


def test_strings_hold_no_raw_control_characters_and_an_unknown_name_fails():
    assert rules(tool_grammar([WEATHER], "required"))["j-char"].startswith(r'[^"\\\x7F\x00-\x1F]')
    with pytest.raises(ValueError, match="'other'"):
        call_schema([WEATHER], {"type": "function", "function": {"name": "other"}})


def test_auto_has_the_grammar_of_what_follows_each_way_a_call_may_have_started():
    from shoal.llm.tool_grammar import lazy_tool_grammar

    lazy = lazy_tool_grammar([WEATHER, NOW])
    assert [opening for opening, _ in lazy.openings] == ["<tool_call>\n", "<tool_call>", "<tool_call"]
    roots = [rules(grammar)["root"] for _, grammar in lazy.openings]
    assert roots == [
        'j-root "\\n</tool_call>" ("\\n" tool-call)*',
        '"\\n" j-root "\\n</tool_call>" ("\\n" tool-call)*',
        '">\\n" j-root "\\n</tool_call>" ("\\n" tool-call)*',  # a token carrying more than `>` is ruled out
    ]
    assert all(rules(grammar)["j-root"] == "j-alternative-0 | j-alternative-1" for _, grammar in lazy.openings)
    single = lazy_tool_grammar([WEATHER], parallel=False)
    assert rules(single.openings[1][1])["root"] == '"\\n" j-root "\\n</tool_call>"'


def _tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def _defs(unit: list[str], key: str = "$defs") -> dict:
    """Pydantic's form: a model's nested types under `$defs`, referred to from the root."""
    return {
        key: {"Unit": {"type": "string", "enum": unit}},
        "type": "object",
        "properties": {"unit": {"$ref": f"#/{key}/Unit"}},
        "required": ["unit"],
    }


def test_the_parameters_definitions_move_to_the_root_where_their_references_point():
    for key in ("$defs", "definitions"):
        grammar = rules(tool_grammar([_tool("w", _defs(["c", "f"], key))], "required"))
        assert grammar["j-Unit"] == '"\\"c\\"" | "\\"f\\""' and grammar["j-arguments-unit"] == "j-Unit"


def test_a_definition_two_functions_name_alike_but_differ_in_is_renamed_in_the_second():
    schema = call_schema([_tool("w", _defs(["c"])), _tool("v", _defs(["k"])), _tool("u", _defs(["c"]))], "required")
    assert schema["$defs"] == {"Unit": {"type": "string", "enum": ["c"]}, "Unit_": {"type": "string", "enum": ["k"]}}
    refs = [alt["properties"]["arguments"]["properties"]["unit"]["$ref"] for alt in schema["oneOf"]]
    assert refs == ["#/$defs/Unit", "#/$defs/Unit_", "#/$defs/Unit"]
    assert "j-Unit-" in rules(tool_grammar([_tool("w", _defs(["c"])), _tool("v", _defs(["k"]))], "required"))


def test_definitions_named_as_this_modules_rules_do_not_redefine_them():
    thing = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    call = {"type": "object", "properties": {"call": thing}, "required": ["call"]}  # rule `tool-call` too
    defs = {"tool-call": thing, "root": thing, "tool": call, "j-root": thing}
    parameters = {"$defs": defs, "properties": {k: {"$ref": f"#/$defs/{k}"} for k in defs}, "type": "object"}
    for grammar in (tool_grammar([_tool("w", parameters)], "required"), tool_grammar([_tool("w", parameters)], "auto")):
        defined = [line.split(" ::= ", 1)[0] for line in grammar.splitlines()]
        assert len(defined) == len(set(defined)), sorted(defined)
        assert rules(grammar)["tool-call"] == '"<tool_call>\\n" j-root "\\n</tool_call>"'
        assert {"j-tool-call", "j-tool", "j-tool-call-kv"} <= set(defined)


def test_parameters_that_refer_into_themselves_are_reached_through_a_definition_of_their_own():
    home = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    office = {"properties": {"home": home, "work": {"$ref": "#/properties/home"}}, "type": "object"}
    tree = {
        "type": "object",
        "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
    }
    schema = call_schema([_tool("o", office), _tool("t", tree), WEATHER], "required")
    assert schema["oneOf"][0]["properties"]["arguments"] == {"$ref": "#/$defs/o-parameters"}
    assert schema["$defs"]["o-parameters"]["properties"]["work"] == {"$ref": "#/$defs/o-parameters/properties/home"}
    assert schema["$defs"]["t-parameters"]["properties"]["kids"]["items"] == {"$ref": "#/$defs/t-parameters"}
    assert schema["oneOf"][2]["properties"]["arguments"] == WEATHER["function"]["parameters"]  # untouched
    grammar = rules(tool_grammar([_tool("o", office), _tool("t", tree)], "required"))
    assert grammar["j-t-parameters-kids-item"] == "j-t-parameters"  # the tree's recursion
    assert grammar["j-o-parameters-work"] == "j-home" and "j-home-city-kv" in grammar["j-home"]  # the reference


def test_prefixed_renames_names_and_leaves_literals_and_classes():
    from shoal.llm.tool_grammar import prefixed

    grammar = 'root ::= a ("a" [a-z\\]a] a)* # a comment: a\na ::= "\\"a" b{1,2}\nb ::= [^"\\\\]'
    assert prefixed(grammar, "p-").splitlines() == [
        'p-root ::= p-a ("a" [a-z\\]a] p-a)* # a comment: a',
        'p-a ::= "\\"a" p-b{1,2}',
        'p-b ::= [^"\\\\]',
    ]


BAD_SCHEMAS = [
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "[a-z]+"}}},  # no ^...$
    {"type": "object", "properties": {"code": {"type": "strin"}}},  # a type the converter lacks
]


@pytest.mark.parametrize("schema", BAD_SCHEMAS)
def test_auto_with_a_schema_the_converter_refuses_runs_unguided_with_one_warning(schema, caplog):
    from shoal.llm.tool_grammar import _unguided, request_grammar

    _unguided.cache_clear()  # warned once per process: this test's own first warnings
    with caplog.at_level("WARNING", logger="shoal.llm"):
        assert request_grammar([WEATHER, _tool("lookup", schema)], "auto", True, None) == ""
        assert request_grammar([_tool("lookup", schema)], None, True, None) == ""
        for _ in range(3):  # the next turns with the same tools: no more warnings
            assert request_grammar([_tool("lookup", schema)], "auto", True, None) == ""
    assert len(caplog.records) == 2 and "lookup" in caplog.records[0].getMessage()
    with pytest.raises(AssertionError):  # forcing a call still needs its grammar: the caller's error
        request_grammar([_tool("lookup", schema)], "required", True, None)


def test_auto_with_a_pydantic_schema_is_guided(caplog):
    from shoal.llm.llama_c_api import LazyGrammar
    from shoal.llm.tool_grammar import request_grammar

    with caplog.at_level("WARNING", logger="shoal.llm"):
        lazy = request_grammar([_tool("w", _defs(["c", "f"]))], "auto", True, None)
    assert isinstance(lazy, LazyGrammar) and not caplog.records
    assert all(rules(grammar)["j-Unit"] == '"\\"c\\"" | "\\"f\\""' for _, grammar in lazy.openings)


def test_tools_with_a_response_format_are_refused_as_the_gateway_refuses_them():
    from shoal.llm.tool_grammar import request_grammar

    json_object = '{"type": "json_object"}'
    for choice in (None, "auto", "required"):
        with pytest.raises(ValueError, match="response_format with tools"):
            request_grammar([WEATHER], choice, True, json_object)
    assert request_grammar([WEATHER], "none", True, json_object) == request_grammar(None, None, True, json_object)
    assert "root   ::= object" in request_grammar(None, None, True, json_object)
    assert request_grammar([WEATHER], "auto", True, '{"type": "text"}') != ""
    with pytest.raises(ValueError, match="no tools were given"):
        request_grammar(None, "required", True, None)


def test_the_lazy_grammar_of_the_same_tools_is_made_once():
    from shoal.llm.tool_grammar import lazy_tool_grammar

    again = [{"function": {"parameters": WEATHER["function"]["parameters"], "name": "get_weather"}, "type": "function"}]
    assert lazy_tool_grammar([WEATHER]) is lazy_tool_grammar(again)  # the same JSON, keys in any order
    assert lazy_tool_grammar([WEATHER]) is not lazy_tool_grammar([WEATHER], parallel=False)


def test_a_reference_through_a_list_points_at_a_copy_of_its_target():
    """The converter walks `#/properties/x/anyOf/0` by keys and cannot index `anyOf`'s list: the
    target is copied into the parameters' definitions, recursion through it included."""
    point = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    node = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/properties/tree/anyOf/0"}}}}
    parameters = {
        "type": "object",
        "properties": {
            "x": {"anyOf": [point, {"type": "null"}]},
            "y": {"$ref": "#/properties/x/anyOf/0"},
            "tree": {"anyOf": [node, {"type": "null"}]},
        },
    }
    schema = call_schema([_tool("p", parameters)], "required")
    arguments = schema["properties"]["arguments"]
    assert arguments["properties"]["y"] == {"$ref": "#/$defs/properties-x-anyOf-0"}
    assert schema["$defs"]["properties-x-anyOf-0"] == point
    lifted_node = schema["$defs"]["properties-tree-anyOf-0"]
    assert lifted_node["properties"]["kids"]["items"] == {"$ref": "#/$defs/properties-tree-anyOf-0"}
    grammar = rules(tool_grammar([_tool("p", parameters)], "auto"))  # no longer refused: guided
    assert grammar["j-arguments-y"] == "j-properties-x-anyOf-0"
    assert "j-properties-x-anyOf-0-n-kv" in grammar["j-properties-x-anyOf-0"]


def test_a_listed_target_that_refers_elsewhere_in_the_parameters_is_left_as_it_was():
    parameters = {
        "type": "object",
        "properties": {
            "a": {"type": "string"},
            "x": {"anyOf": [{"type": "object", "properties": {"b": {"$ref": "#/properties/a"}}}, {"type": "null"}]},
            "y": {"$ref": "#/properties/x/anyOf/0"},
        },
    }
    schema = call_schema([_tool("p", parameters)], "required")
    assert "$defs" not in schema or not any(k.startswith("properties-") for k in schema["$defs"])

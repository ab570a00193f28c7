"""What real clients do with the tools, played on the raw pipe.

- Structured-first clients (Claude Code, Codex, pydantic-ai) give the model
  `structuredContent` alone: what a program printed must be in it.
- Gemini CLI adds `wait_for_previous` to every call; LangChain adapters and
  OpenAI strict schemas send `null` for every optional argument they were
  not given.
- smolagents (through mcpadapt) reads `inputSchema["properties"]` of every
  tool; the Inspector's `--strict` lints every schema.

Every answer here is checked against the outputSchema its tool declares.
"""

from __future__ import annotations


import jsonschema
import pytest
from conftest import LEGACY, MODERN, RawServer, serve_argv, text_of, wait_for

from linkrun.state import records

VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
META = {"link.local/thread": "conversation-clients"}
PRINTED = str(2**100)
# The types smolagents accepts for a tool input (smolagents.tools.AUTHORIZED_TYPES).
SMOLAGENTS_TYPES = {"string", "boolean", "integer", "number", "image", "audio", "array", "object", "any", "null"}


class Client:
    """A raw-pipe client that knows the declared schemas and checks every answer against them."""

    def __init__(self, server: RawServer, era: str = "legacy"):
        self.server = server
        self.era = era
        if era == "legacy":
            server.initialize(LEGACY)
        listing = self.request("tools/list")
        self.tools = {tool["name"]: tool for tool in listing["tools"]}

    def request(self, method: str, params: dict | None = None, meta: dict | None = None) -> dict:
        params = dict(params or {})
        if self.era == "modern":
            meta = {VERSION_KEY: MODERN, CAPABILITIES_KEY: {}, **(meta or {})}
        if meta:
            params["_meta"] = meta
        response = self.server.request(method, params, timeout=30)
        assert "result" in response, response
        return response["result"]

    def call(self, name: str, arguments: dict, meta: dict | None = None) -> dict:
        result = self.request("tools/call", {"name": name, "arguments": arguments}, meta)
        if "structuredContent" in result:
            jsonschema.validate(result["structuredContent"], self.tools[name]["outputSchema"])
        return result

    def succeeds(self, name: str, arguments: dict, meta: dict | None = None) -> dict:
        result = self.call(name, arguments, meta)
        assert "isError" not in result, text_of(result)
        return result


@pytest.fixture
def client(servers, files) -> Client:
    return Client(servers(serve_argv(files)))


@pytest.fixture
def background(servers, files, state) -> Client:
    argv = serve_argv(files, "--state", str(state), "--no-way-in", "--background", "4",
                      "--background-timeout", "1h", "--background-output", "16M", "--background-keep", "1d",
                      "--background-per-day", "100", "--hops", "4")
    return Client(servers(argv))


def ended(client: Client, command_id: str, **arguments) -> dict:
    """read with wait until the command has ended; its last answer."""
    def look():
        result = client.succeeds("read", {"id": command_id, "wait": 5, **arguments}, META)
        return result["structuredContent"]["state"] not in records.RUNNING_STATES and result
    return wait_for(look, timeout=30, what=f"{command_id} to end")


# -- 1. the structured value holds what the program printed (MCP.md P16) ---------


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_the_structured_value_holds_the_printed_number(servers, files, era):
    client = Client(servers(serve_argv(files)), era)
    result = client.succeeds("command", {"program": "python3", "args": ["-c", "print(2**100)"]})
    structured = result["structuredContent"]
    assert structured["output"] == PRINTED
    assert structured["errors"] == ""
    assert text_of(result).count(PRINTED) == 1  # the text holds it once too


def test_each_stream_is_in_the_structured_value_as_the_text_shows_it_cut_included(client):
    script = "seq 1 20000; echo first-error >&2; seq 1 20000 >&2; echo last-error >&2"
    result = client.succeeds("command", {"program": "sh", "args": ["-c", script]})
    structured, text = result["structuredContent"], text_of(result)
    for stream, total in (("output", structured["output_bytes"]), ("errors", structured["errors_bytes"])):
        shown = structured[stream]
        assert f"{stream} ({total} bytes):\n{shown}" in text
        assert "bytes left out …]" in shown
    assert structured["output"].startswith("1\n2\n3\n") and structured["output"].endswith("19999\n20000")
    assert structured["errors"].startswith("first-error\n") and structured["errors"].endswith("last-error")


def test_an_empty_stream_is_an_empty_text(client):
    structured = client.succeeds("command", {"program": "true"})["structuredContent"]
    assert (structured["output"], structured["errors"]) == ("", "")


def test_read_gives_the_returned_bytes_in_its_structured_value(background):
    started = background.succeeds("start", {"program": "python3", "args": ["-c", "print(2**100)"]}, META)
    command_id = started["structuredContent"]["id"]
    last = ended(background, command_id, offset=0)
    structured = last["structuredContent"]
    assert structured["text"] == PRINTED + "\n"
    assert structured["next"] - structured["offset"] == len(structured["text"].encode())
    assert text_of(last).count(PRINTED) == 1


# -- 2. an argument the tool does not know is ignored, and said (MCP.md P17) ------


def test_gemini_clis_wait_for_previous_is_ignored_and_said(client):
    result = client.succeeds("command", {"program": "echo", "args": ["gemini"], "wait_for_previous": True})
    assert result["structuredContent"]["ignored"] == ["wait_for_previous"]
    assert result["structuredContent"]["output"] == "gemini"
    assert "ignored" in text_of(result) and "wait_for_previous" in text_of(result)


def test_a_misspelt_argument_stays_visible_in_the_text_and_the_structured_value(client):
    result = client.succeeds("command", {"program": "echo", "timout": 5, "zz": 1})
    assert result["structuredContent"]["ignored"] == ["timout", "zz"]
    last = text_of(result).splitlines()[-1]
    assert "timout, zz" in last and "timeout" in last  # names what was ignored, and the arguments it takes


def test_an_answer_with_nothing_ignored_has_no_ignored_key(client):
    assert "ignored" not in client.succeeds("command", {"program": "true"})["structuredContent"]


def test_a_refused_call_still_says_what_was_ignored(client):
    result = client.call("command", {"program": "rm", "wait_for_previous": False})
    assert result["isError"] is True
    assert "not allowed" in text_of(result) and "wait_for_previous" in text_of(result)


def test_every_background_tool_ignores_an_unknown_argument(background):
    extra = {"wait_for_previous": True}
    started = background.succeeds("start", {"program": "echo", "args": ["bg"], **extra}, META)
    assert started["structuredContent"]["ignored"] == ["wait_for_previous"]
    command_id = started["structuredContent"]["id"]
    last = ended(background, command_id, offset=0, **extra)
    assert last["structuredContent"]["ignored"] == ["wait_for_previous"]
    assert background.succeeds("list", extra, META)["structuredContent"]["ignored"] == ["wait_for_previous"]
    stopped = background.succeeds("stop", {"id": command_id, **extra}, META)
    assert stopped["structuredContent"]["ignored"] == ["wait_for_previous"]
    # start takes no timeout: it is ignored, not refused.
    timed = background.succeeds("start", {"program": "true", "timeout": 5}, META)
    assert timed["structuredContent"]["ignored"] == ["timeout"]


# -- 3. null is absent, for every optional argument (MCP.md P17) -------------------


def test_null_optional_arguments_of_command_are_absent(client):
    nulls = {"args": None, "input": None, "folder": None, "timeout": None}
    result = client.succeeds("command", {"program": "true", **nulls})
    assert result["structuredContent"]["exit"] == 0
    assert "ignored" not in result["structuredContent"]


def test_a_null_required_argument_is_refused_as_missing(client):
    result = client.call("command", {"program": None})
    assert result["isError"] is True and "program is missing" in text_of(result)


def test_null_optional_arguments_of_the_background_tools_are_absent(background):
    nulls = {"args": None, "input": None, "folder": None}
    started = background.succeeds("start", {"program": "true", **nulls}, META)
    command_id = started["structuredContent"]["id"]
    last = ended(background, command_id, offset=None)
    assert last["structuredContent"]["state"] == "exited"
    assert "ignored" not in last["structuredContent"]
    background.succeeds("read", {"id": command_id, "offset": None, "wait": None}, META)


# -- 4. every inputSchema has properties, as smolagents reads them (MCP.md P17) ---


def smolagents_inputs(tool: dict) -> dict[str, dict]:
    """What mcpadapt's smolagents adapter builds from a tool: it indexes
    inputSchema["properties"] and reads each property's one type."""
    schema = tool["inputSchema"]
    inputs = {}
    for name, prop in schema["properties"].items():
        assert prop["type"] in SMOLAGENTS_TYPES, (tool["name"], name, prop)
        inputs[name] = {"type": prop["type"], "description": prop.get("description", ""),
                        "nullable": name not in schema.get("required", [])}
    return inputs


def test_smolagents_can_read_every_tools_inputs(client, background):
    for tools in (client.tools, background.tools):
        for tool in tools.values():
            smolagents_inputs(tool)
    assert smolagents_inputs(background.tools["list"]) == {}


# -- 5. the schemas pass the Inspector's --strict ---------------------------------
#
# The rules of the Inspector's schema lint (core/json/schemaLint.ts), each a
# construct real MCP clients refuse or mishandle: a bare boolean where a
# schema is expected (but as additionalProperties and its kind); a `type`
# array; a `$ref` outside the document; a schema that constrains nothing; an
# inputSchema whose root is not an object. To them we add smolagents'
# `properties` on every inputSchema.

BOOLEAN_VALUED = {"additionalProperties", "unevaluatedProperties", "additionalItems", "unevaluatedItems"}
ONE_SCHEMA = ["items", "contains", "not", "propertyNames", "if", "then", "else", *sorted(BOOLEAN_VALUED)]
SCHEMA_LISTS = ["allOf", "anyOf", "oneOf", "prefixItems"]
SCHEMA_MAPS = ["properties", "patternProperties", "dependentSchemas", "dependencies", "$defs", "definitions"]
CONSTRAINING = {
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "format", "maxItems", "minItems", "uniqueItems", "maxContains",
    "minContains", "maxProperties", "minProperties", "required", "dependentRequired", "$ref", "$dynamicRef",
    "$recursiveRef", *ONE_SCHEMA, *SCHEMA_LISTS, *SCHEMA_MAPS[:4],
}


def strict_findings(node, path: str = "", keyword: str | None = None) -> list[str]:
    """Every place a schema breaks one of the rules above."""
    if isinstance(node, bool):
        return [] if keyword in BOOLEAN_VALUED else [f"{path or '(root)'}: a bare {node} for a schema"]
    if not isinstance(node, dict):
        return []
    found = []
    if isinstance(node.get("type"), list):
        found.append(f"{path or '(root)'}: type is an array {node['type']}; use anyOf")
    if isinstance(node.get("$ref"), str) and not node["$ref"].startswith("#"):
        found.append(f"{path or '(root)'}: $ref outside the document")
    if not CONSTRAINING & set(node):
        found.append(f"{path or '(root)'}: constrains nothing")
    for key in SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                found += strict_findings(sub, f"{path}.{key}.{name}", key)
    for key in SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            for index, sub in enumerate(node[key]):
                found += strict_findings(sub, f"{path}.{key}[{index}]", key)
    for key in ONE_SCHEMA:
        if key in node:
            found += strict_findings(node[key], f"{path}.{key}", key)
    return found


def tool_findings(tool: dict) -> list[str]:
    found = [f"inputSchema{f}" for f in strict_findings(tool["inputSchema"])]
    found += [f"outputSchema{f}" for f in strict_findings(tool.get("outputSchema", {"type": "object"}))]
    if tool["inputSchema"].get("type") != "object":
        found.append("inputSchema: the root is not an object")
    if not isinstance(tool["inputSchema"].get("properties"), dict):
        found.append("inputSchema: no properties")
    return [f"{tool['name']}.{f}" for f in found]


def test_the_strict_rules_catch_what_they_must():
    assert strict_findings({"type": "object", "properties": {"x": {"type": ["integer", "null"]}}})
    assert strict_findings({"type": "object", "properties": {"x": True}})
    assert strict_findings({"type": "object", "properties": {"x": {"description": "anything"}}})
    assert strict_findings({"anyOf": [{"type": "string"}, {"$ref": "https://example.com/s.json"}]})
    assert not strict_findings({"type": "object", "additionalProperties": False,
                                "properties": {"x": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}})
    assert tool_findings({"name": "t", "inputSchema": {"type": "object"}}) == ["t.inputSchema: no properties"]


def test_every_schema_passes_the_strict_rules(client, background):
    found = [f for tools in (client.tools, background.tools) for tool in tools.values() for f in tool_findings(tool)]
    assert found == []

"""serve's notes reach every model, once.

A note is what serve adds to a program's answer: the proxy refused a host,
the sandbox refused a write, the call had no internet, a limit bit, an
argument was ignored, a read's bytes were dropped or it ended. Text-first
clients (Gemini CLI, opencode) give the model the text; structured-first
ones (Claude Code, Codex, pydantic-ai) the structured value alone. So each
note is in both: once in the text, once in the structured value's `notes`,
which every tool's outputSchema declares.
"""

from __future__ import annotations

import jsonschema
import orjson
import pytest
from conftest import SERVER, RawServer, require_sandbox, serve_argv, text_of, wait_for
from sandbox_helpers import Agent

from linkrun.state import records

META = {"link.local/thread": "conversation-notes"}


class Client:
    """A raw-pipe client that checks every answer against the outputSchema its tool declares."""

    def __init__(self, server: RawServer):
        self.server = server
        server.initialize()
        self.tools = {tool["name"]: tool for tool in server.request("tools/list")["result"]["tools"]}

    def succeeds(self, name: str, arguments: dict, meta: dict | None = None) -> dict:
        result = self.server.call(name, arguments, meta)
        assert "isError" not in result, text_of(result)
        jsonschema.validate(result["structuredContent"], self.tools[name]["outputSchema"])
        return result


def ended(client: Client, command_id: str, **arguments) -> dict:
    """read with wait until the command has ended; its last answer."""
    def look():
        result = client.succeeds("read", {"id": command_id, "wait": 5, **arguments}, META)
        return result["structuredContent"]["state"] not in records.RUNNING_STATES and result
    return wait_for(look, timeout=30, what=f"{command_id} to end")

REFUSED_WRITE = "[the sandbox refused a write"


def read_once_by_each_kind_of_client(result: dict, note: str) -> None:
    """The note once in the text (text-first clients), once in the structured value (structured-first ones)."""
    assert text_of(result).count(note) == 1, text_of(result)
    structured = result["structuredContent"]
    assert orjson.dumps(structured).decode().count(note) == 1, structured
    assert any(note in line for line in structured["notes"]), structured


@pytest.fixture
def plain(servers, files) -> Client:
    return Client(servers(serve_argv(files)))


@pytest.fixture
def background(servers, files, state) -> Client:
    return Client(servers(serve_argv(files, "--state", str(state), "--no-way-in", "--background", "4",
                                     "--background-timeout", "1h", "--background-output", "16M",
                                     "--background-keep", "1d", "--background-per-day", "100", "--hops", "4")))


def test_every_tool_declares_its_notes_in_its_output_schema(background):
    client = background
    assert sorted(client.tools) == ["command", "list", "read", "start", "stop", "write"]
    for tool in client.tools.values():
        notes = tool["outputSchema"]["properties"]["notes"]
        assert notes["type"] == "array" and notes["items"] == {"type": "string"}, tool["name"]
        assert "notes" not in tool["outputSchema"].get("required", [])


def up_client(tmp_path, servers, sandbox_text: str = "") -> Client:
    """`up` over a real sandbox, as a plain client starts it."""
    require_sandbox()
    box = Agent(tmp_path, sandbox_text)
    return Client(servers(SERVER + ["up", "--agent", str(box.root), "--sandbox", str(box.file)], env=box.env))


def test_a_refused_write_and_an_ignored_argument_are_notes_read_once_by_every_client(tmp_path, servers):
    client = up_client(tmp_path, servers)
    result = client.succeeds("command", {"program": "sh", "args": ["-c", "touch x"], "wait_for_previous": True})
    read_once_by_each_kind_of_client(result, REFUSED_WRITE)
    read_once_by_each_kind_of_client(result, "[ignored wait_for_previous: not arguments of this tool")
    structured = result["structuredContent"]
    assert len(structured["notes"]) == 2, structured["notes"]
    assert all(text_of(result).count(note) == 1 for note in structured["notes"])  # each note whole, as the text has it
    assert structured["errors"].endswith("Read-only file system")  # the program's bytes stay the program's


def test_an_ignored_argument_is_a_note_without_a_sandbox_too(plain):
    result = plain.succeeds("command", {"program": "echo", "args": ["hi"], "timout": 5})
    read_once_by_each_kind_of_client(result, "[ignored timout: not arguments of this tool, whose arguments are ")
    assert result["structuredContent"]["ignored"] == ["timout"]


def test_an_answer_without_a_note_has_no_notes(plain):
    assert "notes" not in plain.succeeds("command", {"program": "echo", "args": ["fine"]})["structuredContent"]


def test_a_reads_header_notes_are_in_its_structured_value(background):
    client = background
    command_id = client.succeeds("start", {"program": "echo", "args": ["bg"]}, META)["structuredContent"]["id"]
    last = ended(client, command_id, offset=0)
    assert "ended: no more output" in last["structuredContent"]["notes"]
    header, _, text = text_of(last).partition("\n")
    assert "ended: no more output" in header and text == "bg\n"  # after the header, the bytes alone


def test_the_proxys_refusal_is_a_note_every_client_reads_once(tmp_path, site, servers):
    client = up_client(tmp_path, servers, '[internet]\nhosts = ["example.org"]\n')
    result = client.succeeds("command", {"program": "sh", "args": ["-c", f"curl -sS http://127.0.0.2:{site}/x"]})
    read_once_by_each_kind_of_client(result, f"[the agent's proxy refused 127.0.0.2:{site}")
    assert client.server.close() == 0

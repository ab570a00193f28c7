"""Background commands for plain MCP clients, late cancels, the supervisor's
command line and read's text: real servers, real supervisors, real pipes.

- Claude Code, Gemini CLI, opencode and Cursor send no conversation in
  `_meta`; Codex sends `_meta.threadId` (its thread's id). Under
  `--no-way-in` their background calls work: Codex's belong to its thread,
  the others' to the agent's one default conversation.
- opencode sends `notifications/cancelled` about 50 ms after every answer.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from background_helpers import wait_ended, wait_running
from conftest import parent_of, serve_argv, text_of, wait_for

from linkrun.state import records

CODEX = {"threadId": "019c22a7-5e1b-7c30-9a41-0d2f6f1b8e55"}
OTHER_CODEX = {"threadId": "019c22a7-0000-7000-8000-000000000000"}
LINKED = {"link.local/thread": "conversation-1"}


def background_argv(files: Path, state: Path, *way_in: str, output: str = "16M") -> list[str]:
    return serve_argv(files, "--state", str(state), *(way_in or ("--no-way-in",)), "--background", "4",
                      "--background-timeout", "1h", "--background-output", output, "--background-keep", "1d",
                      "--background-per-day", "100", "--hops", "4")


@pytest.fixture
def plain(servers, files, state):
    server = servers(background_argv(files, state))
    server.initialize()
    return server


def succeeds(server, tool: str, arguments: dict, meta: dict | None = None) -> dict:
    result = server.call(tool, arguments, meta=meta)
    assert "isError" not in result, text_of(result)
    return result


def start(server, meta: dict | None = None, **arguments) -> str:
    return succeeds(server, "start", arguments, meta)["structuredContent"]["id"]


def listed(server, meta: dict | None = None) -> list[str]:
    return [c["id"] for c in succeeds(server, "list", {}, meta)["structuredContent"]["commands"]]


# -- 6. a plain client's background calls (no link.local/thread) --------------------


def test_a_client_that_names_no_conversation_gets_the_default_one(plain, state):
    command_id = start(plain, program="sh", args=["-c", "echo plain"])
    assert records.load(str(state), command_id)["thread"] == "default"
    wait_ended(state, command_id)
    assert listed(plain) == [command_id]
    value = succeeds(plain, "read", {"id": command_id, "offset": 0})["structuredContent"]
    assert value["text"] == "plain\n"
    assert succeeds(plain, "stop", {"id": command_id})["structuredContent"]["state"] == "exited"
    # A conversation of its own sees none of the default one's, and the reverse.
    assert listed(plain, LINKED) == []
    mine = start(plain, LINKED, program="true")
    assert listed(plain) == [command_id] and listed(plain, LINKED) == [mine]


def test_codexs_thread_is_its_conversation(plain, state):
    ours = start(plain, CODEX, program="sleep", args=["100"])
    assert records.load(str(state), ours)["thread"] == CODEX["threadId"]
    assert listed(plain, CODEX) == [ours]
    assert listed(plain) == [] and listed(plain, OTHER_CODEX) == []
    theirs = plain.call("stop", {"id": ours}, meta=OTHER_CODEX)
    assert theirs["isError"] is True and "no command of this conversation's" in text_of(theirs)
    assert succeeds(plain, "stop", {"id": ours}, CODEX)["structuredContent"]["state"] == "stopped"


def test_link_locals_thread_wins_over_codexs(plain):
    command_id = start(plain, {**CODEX, **LINKED}, program="true")
    assert listed(plain, LINKED) == [command_id] and listed(plain, CODEX) == []


@pytest.mark.parametrize("meta", [{"link.local/thread": ""}, {"link.local/thread": 7}])
def test_a_malformed_link_local_thread_is_still_refused(plain, meta):
    result = plain.call("start", {"program": "true"}, meta=meta)
    assert result["isError"] is True and "non-empty string" in text_of(result)


def test_the_instructions_say_which_conversation_a_plain_client_gets(servers, files, state):
    instructions = servers(background_argv(files, state)).initialize()["instructions"]
    assert "default conversation" in instructions and "threadId" in instructions


def test_with_a_way_in_a_background_call_still_needs_the_conversation(servers, files, state, tmp_path):
    keyring = tmp_path / "keyring"
    keyring.mkdir(mode=0o700)
    key = keyring / "agent.key"
    key.write_bytes(os.urandom(32).hex().encode() + b"\n")
    key.chmod(0o600)
    server = servers(background_argv(files, state, "--way-in", "http://127.0.0.1:9/in", "--as", "agent",
                                     "--keyring", str(keyring)))
    instructions = server.initialize()["instructions"]
    assert "default conversation" not in instructions
    for meta in (None, CODEX):
        for tool, arguments in (("start", {"program": "true"}), ("list", {}), ("read", {"id": "a" * 16}),
                                ("stop", {"id": "a" * 16})):
            result = server.call(tool, arguments, meta=meta)
            assert result["isError"] is True and "need the conversation" in text_of(result), (tool, meta)
    assert records.ids(str(state)) == []


# -- 7. a late cancel touches nothing (opencode, MCP.md P19) -------------------------


@pytest.mark.parametrize("order", ["cancel, then the new call", "the new call, then the cancel"])
def test_a_late_cancel_never_touches_a_later_call_with_the_same_id(plain, order):
    first = plain.call("command", {"program": "echo", "args": ["one"]}, request_id=7)
    assert first["structuredContent"]["output"] == "one"
    cancel = {"requestId": 7, "reason": "the answer came"}
    later = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
             "params": {"name": "command", "arguments": {"program": "sh", "args": ["-c", "sleep 1; echo two"]}}}
    if order.startswith("cancel"):
        plain.notify("notifications/cancelled", cancel)
        plain.send(later)
    else:
        plain.send(later)
        plain.notify("notifications/cancelled", cancel)
    second = plain.wait_response(7, timeout=30)["result"]
    assert second["structuredContent"]["output"] == "two"


def test_a_late_cancel_of_start_leaves_its_command_running(plain, state, files):
    arguments = {"program": "sh", "args": ["-c", "sleep 1; echo survived"]}
    result = plain.call("start", arguments, LINKED, request_id="s")
    command_id = result["structuredContent"]["id"]
    plain.notify("notifications/cancelled", {"requestId": "s"})
    assert plain.call("command", {"program": "true"})["structuredContent"]["exit"] == 0  # the cancel was read
    ended = wait_ended(state, command_id)
    assert (ended["state"], ended["exit"]) == ("exited", 0)
    assert (files / "background" / f"{command_id}.out").read_bytes() == b"survived\n"


# -- 10. the supervisor under the seeds' words ---------------------------------------


def test_a_supervisors_command_line_holds_the_seeds_words_as_whole_arguments(plain, state):
    command_id = start(plain, LINKED, program="sleep", args=["100"])
    gate = wait_running(state, command_id)["leader_pid"]
    supervisor = parent_of(gate)
    argv = Path(f"/proc/{supervisor}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
    at = argv.index("supervise")
    assert argv[at:at + 4] == ["supervise", command_id, "--state", str(state)]
    assert not any("\n" in argument for argument in argv), argv  # no program text on ps's line
    assert "-c" not in argv


# -- 11. read's text: a header line, then exactly the bytes ---------------------------


def header_and_bytes(result: dict) -> tuple[str, str]:
    header, _, rest = text_of(result).partition("\n")
    return header, rest


def test_reads_text_is_a_header_then_exactly_the_bytes(plain, state):
    script = "printf 'line one\\n[… bytes 0–9 were dropped …]\\n(no more output: it has ended)'"
    command_id = start(plain, LINKED, program="sh", args=["-c", script])
    wait_ended(state, command_id)
    result = succeeds(plain, "read", {"id": command_id, "offset": 0, "wait_for_previous": True}, LINKED)
    header, rest = header_and_bytes(result)
    value = result["structuredContent"]
    assert rest == value["text"] and rest.startswith("line one\n") and rest.endswith("it has ended)")
    assert header.startswith(f"{command_id} · exited (exit 0) · bytes 0–{value['total']} of {value['total']}")
    assert "ended" in header and "wait_for_previous" in header  # every note is in the header


def test_reads_header_says_nothing_new_yet_and_no_bytes_follow(plain, state):
    command_id = start(plain, LINKED, program="sh", args=["-c", "printf ab; sleep 100"])
    wait_for(lambda: succeeds(plain, "read", {"id": command_id}, LINKED)["structuredContent"]["next"] == 2,
             what="its first bytes")
    header, rest = header_and_bytes(succeeds(plain, "read", {"id": command_id, "offset": 2}, LINKED))
    assert rest == ""
    assert header.startswith(f"{command_id} · running · bytes 2–2 of 2") and "nothing new yet" in header


def test_reads_header_says_what_was_dropped_and_the_bytes_follow_alone(servers, files, state):
    server = servers(background_argv(files, state, output="1K"))
    server.initialize()
    command_id = start(server, LINKED, program="sh", args=["-c", "seq 1 2000"])
    ended = wait_ended(state, command_id)
    result = succeeds(server, "read", {"id": command_id, "offset": 0}, LINKED)
    header, rest = header_and_bytes(result)
    assert f"bytes 0–{ended['kept_from']} dropped" in header
    assert rest == result["structuredContent"]["text"] and rest.endswith("2000\n")

"""`up` answers the handshake at once, whatever it still has to do.

`codex exec` asks its model without our tools when the server's first
answer takes more than about a second, and `up`'s checks (the /etc view,
the sandbox's probe) took seconds on a loaded machine. So `up` answers
`initialize` and `tools/list` first, and holds only the calls that run a
program in the sandbox until its checks end; when they fail, those calls
are refused naming the fix. Here the checks are held on purpose, by the
lock of the agent's /etc view, the first thing they take.
"""

from __future__ import annotations

import fcntl
import os
import subprocess

import orjson
from conftest import LEGACY, SERVER, require_sandbox, text_of
from kept_helpers import NUMBERS, keep_argv
from sandbox_helpers import Agent, outer_sandbox

from linkrun import up
from linkrun.state import layout

NO_WAY_IN = ["--no-way-in"]


def hold_the_etc_view(box: Agent) -> int:
    """The agent's /etc view lock, taken as a rebuilding serve holds it: `up`'s checks wait for it."""
    fd = os.open(box.root / "State" / layout.ETC_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_up_answers_the_handshake_while_its_checks_wait_and_holds_only_the_calls_that_run_a_program(
        tmp_path, servers):
    require_sandbox()
    box = Agent(tmp_path)
    lock = hold_the_etc_view(box)
    try:
        server = servers(SERVER + ["up", "--agent", str(box.root), *NO_WAY_IN], env=box.env)
        assert "command tool" in server.initialize()["instructions"]
        names = sorted(tool["name"] for tool in server.request("tools/list")["result"]["tools"])
        assert names == ["command", "list", "read", "start", "stop", "write"]
        server.send({"jsonrpc": "2.0", "id": "held", "method": "tools/call",
                     "params": {"name": "command", "arguments": {"program": "sh", "args": ["-c", "echo ran"]}}})
        # A tool that runs nothing in the sandbox is answered meanwhile; the held call is not.
        assert server.call("list", {})["structuredContent"] == {"commands": []}
        assert all(message.get("id") != "held" for message in server.pending)
    finally:
        os.close(lock)
    held = server.wait_response("held", timeout=30)["result"]
    assert text_of(held).startswith("exit 0") and held["structuredContent"]["output"] == "ran", held
    assert server.close() == 0


def test_serve_as_up_execs_it_in_a_systemd_scope_answers_first_and_checks_after(tmp_path, servers):
    require_sandbox()
    box = Agent(tmp_path)
    argv = up.plan(["--agent", str(box.root), *NO_WAY_IN], box.env)  # the serve it execs (in a scope, where one is had)
    lock = hold_the_etc_view(box)
    try:
        server = servers(argv, env=box.env)
        assert "command tool" in server.initialize()["instructions"]
        server.send({"jsonrpc": "2.0", "id": "held", "method": "tools/call",
                     "params": {"name": "command", "arguments": {"program": "sh", "args": ["-c", "echo ran"]}}})
        assert server.call("list", {})["structuredContent"] == {"commands": []}
        assert all(message.get("id") != "held" for message in server.pending)
    finally:
        os.close(lock)
    held = server.wait_response("held", timeout=30)["result"]
    assert held["structuredContent"]["output"] == "ran", held
    assert server.close() == 0


def test_when_ups_checks_fail_its_calls_say_why_and_it_ends_with_exit_1(tmp_path, servers):
    require_sandbox()
    box = Agent(tmp_path)
    server = servers(outer_sandbox("--disable-userns") + SERVER + ["up", "--agent", str(box.root), *NO_WAY_IN],
                     env=box.env)
    server.initialize()
    refused = server.call("command", {"program": "sh", "args": ["-c", "echo never"]})
    assert refused["isError"] is True
    text = text_of(refused)
    assert "the sandbox cannot start here" in text and "refused the sandbox its namespaces" in text, text
    assert "never" not in text
    assert server.call("list", {})["structuredContent"] == {"commands": []}  # what runs nothing still works
    assert server.close(timeout=15) == 1
    assert server.stderr.decode().count("refused the sandbox its namespaces") == 1, server.stderr


# What the handshake pays for: read in the real server's -X importtime lines,
# which it writes on the pipe its answers go to, so the order holds.
TOOL_LAYER = ("linkrun.front.tools", "linkrun.processes.runner", "linkrun.detached.background",
              "linkrun.front.background_tools")
# orjson imports dataclasses, inspect and uuid: the handshake is read and written by the standard library's json;
# the records on its way are NamedTuples and plain classes (dataclasses made their methods at each start).
NOT_FOR_THE_HANDSHAKE = TOOL_LAYER + ("subprocess", "shutil", "tempfile", "socket", "orjson", "dataclasses", "inspect")


def imported_until_answered(server: subprocess.Popen, request_id: int) -> list[str]:
    """The modules the server finished importing before its answer to `request_id`, in order."""
    assert server.stdout is not None
    modules = []
    while line := server.stdout.readline():
        if line.startswith(b"import time:"):
            modules.append(line.decode().rsplit("|", 1)[1].strip())
        elif line.startswith(b"{") and orjson.loads(line).get("id") == request_id:
            return modules
    raise AssertionError(f"the server ended before answering request {request_id}")


def test_up_answers_initialize_before_it_loads_the_tool_layer_and_loads_it_for_tools_list(tmp_path):
    require_sandbox()
    box = Agent(tmp_path)
    argv = [SERVER[0], "-X", "importtime", *SERVER[1:], "up", "--agent", str(box.root), *NO_WAY_IN]
    server = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=box.env)
    assert server.stdin is not None
    try:
        for request_id, method, params in ((1, "initialize", {"protocolVersion": LEGACY, "capabilities": {},
                                                                 "clientInfo": {"name": "t", "version": "0"}}),
                                           (2, "tools/list", {})):
            server.stdin.write(orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                                             "params": params}) + b"\n")
            server.stdin.flush()
            if request_id == 1:
                before = imported_until_answered(server, 1)
                assert "linkrun.front.offer" in before and "tomllib" in before, before
                assert not [name for name in NOT_FOR_THE_HANDSHAKE if name in before], before
            else:
                assert {*TOOL_LAYER, "orjson"} <= set(imported_until_answered(server, 2))
    finally:
        server.communicate(timeout=30)  # closes its input: the server ends
    assert server.returncode == 0


# What only background commands need: what starts, watches and admits them.
BACKGROUND_MACHINERY = ("linkrun.detached.background", "linkrun.detached.gate", "linkrun.detached.warm",
                        "linkrun.detached.admission", "linkrun.detached.watch")


def test_a_call_whose_output_is_kept_loads_nothing_of_background_commands_where_they_are_off(tmp_path):
    """The conversation a kept output belongs to is read for every call: in a
    serve without background commands (up's default without a way in), that
    reading loads none of their machinery (supervisors' gates, the warm forks)."""
    files = tmp_path / "files"
    (files / "work").mkdir(parents=True)
    argv = keep_argv(files, tmp_path / "state")  # no --background: none offered
    server = subprocess.Popen([argv[0], "-X", "importtime", *argv[1:]], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert server.stdin is not None
    try:
        for request_id, method, params in ((1, "initialize", {"protocolVersion": LEGACY, "capabilities": {},
                                                                 "clientInfo": {"name": "t", "version": "0"}}),
                                           (2, "tools/call", {"name": "command", "arguments": {
                                               "program": "python3", "args": NUMBERS}})):
            server.stdin.write(orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                                             "params": params}) + b"\n")
            server.stdin.flush()
            loaded = imported_until_answered(server, request_id)
        assert "linkrun.front.kept" in loaded, loaded  # the call's output was kept
        assert not [name for name in BACKGROUND_MACHINERY if name in loaded], loaded
        assert list((tmp_path / "state" / "kept").glob("*.out")), "the cut output was not kept"
    finally:
        server.communicate(timeout=30)
    assert server.returncode == 0


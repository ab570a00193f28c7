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

from conftest import SERVER, require_sandbox, text_of
from sandbox_helpers import Agent, outer_sandbox

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
        assert names == ["command", "list", "read", "start", "stop"]
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

"""A long call survives its client's timer.

opencode (through the TypeScript SDK) cancels a call after 60 s without a
message about it, and starts its timer again at each progress notification;
so does any client of that SDK given `resetTimeoutOnProgress`. A call with a
progress token therefore gets progress at a steady pace, every
PROGRESS_PACE seconds, even while its program prints nothing.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from conftest import clean_env, serve_argv
from node_helpers import NODE_DIR, need_node

from linkrun.processes.runner import PROGRESS_PACE


def ticks_of_a_silent_call(server, count: int) -> list[tuple[float, dict]]:
    """A call that prints nothing for 30 s, sent with a progress token: its first
    `count` progress notifications, each with the seconds since it was sent."""
    sent = time.monotonic()
    server.send({"jsonrpc": "2.0", "id": "quiet", "method": "tools/call", "params": {
        "name": "command", "arguments": {"program": "sleep", "args": ["30"]}, "_meta": {"progressToken": "q"}}})
    deadline = sent + count * PROGRESS_PACE + 5
    ticks = []
    while len(ticks) < count:
        message = server.next_message(timeout=max(0.0, deadline - time.monotonic()))  # queue.Empty: too late
        if message.get("method") == "notifications/progress":
            ticks.append((time.monotonic() - sent, message["params"]))
        else:
            server.pending.append(message)
    return ticks


def test_a_silent_call_gets_progress_at_a_steady_pace(server):
    server.initialize("2025-06-18")
    (first, one), (second, two) = ticks_of_a_silent_call(server, 2)
    assert PROGRESS_PACE - 1 <= first <= PROGRESS_PACE + 3, first  # not before it was due, nor long after
    assert PROGRESS_PACE - 1 <= second - first <= 15, (first, second)
    assert one["progressToken"] == two["progressToken"] == "q"
    assert 0 < one["progress"] < two["progress"], (one, two)  # rising, though the output did not grow
    assert one["message"] == two["message"] == "0 bytes of output so far"
    server.notify("notifications/cancelled", {"requestId": "quiet"})


@pytest.mark.node
def test_a_silent_call_longer_than_an_sdk_clients_timer_is_answered(files):
    """The TypeScript SDK's timer, as opencode sets it, but shorter than the call: only progress keeps it."""
    node = need_node(NODE_DIR / "node_modules" / "@modelcontextprotocol", "the TypeScript MCP clients are not installed")
    timeout_ms, silence = int((PROGRESS_PACE + 2) * 1000), PROGRESS_PACE + 4
    run = subprocess.run([node, "quiet.mjs", str(timeout_ms), str(silence), "--",
                          *serve_argv(files, programs=("sleep",))],
                         cwd=NODE_DIR, env=clean_env(), capture_output=True, timeout=45)
    assert run.returncode == 0, run.stderr.decode(errors="replace")
    report = json.loads(run.stdout)
    assert report["error"] is None, report
    assert report["answered"].startswith("exit 0") and report["progress"] >= 1, report
    assert report["ms"] > timeout_ms, report  # it did outlast the client's timer

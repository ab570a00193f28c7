"""The TypeScript SDK clients drive the server: v1 (legacy handshake) and v2
(legacy, auto with its server/discover probe on a sibling process, and the
pinned stateless 2026-07-28).

Each run is one conversation scripted in tests/node/scenario.mjs: list the
tools, a call with `_meta`, a refusal, bad arguments, an unknown tool,
progress, a cancelled call, a call after it, and a close. The script prints
what the client saw and the wire as the client's transport carried it; the
judging is done here.

Skipped when node is missing, unless CI is set in the environment (then it
fails): `tools/setup` installs the clients when npm is there.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
from conftest import LEGACY, MODERN, clean_env, pid_alive, serve_argv, wait_for
from node_helpers import NODE_DIR, need_node

pytestmark = pytest.mark.node

RUNS = [("v1", "legacy"), ("v2", "legacy"), ("v2", "auto"), ("v2", MODERN)]
STEPS = ["tools", "call", "refusal", "badArguments", "unknownTool", "progress", "cancel", "afterCancel"]
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
# The SDK closes stdin, then waits 2 s before SIGTERM: a server that exits on
# EOF by itself is gone well before that.
CLIENT_CLOSE_PATIENCE_MS = 2000


def server_processes(files: Path) -> list[int]:
    """Servers (and their children) still running over this files folder."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(files).encode() in cmdline and b"linkrun" in cmdline and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def drive(files: Path, sdk: str, mode: str) -> dict:
    node = need_node(NODE_DIR / "node_modules" / "@modelcontextprotocol",
                     "the TypeScript MCP clients are not installed")
    argv = serve_argv(files, programs=("sh", "echo"))
    run = subprocess.run(
        [node, f"{sdk}.mjs", mode, str(files), "--", *argv],
        cwd=NODE_DIR, env=clean_env(), capture_output=True, timeout=45,
    )
    assert run.returncode == 0, run.stderr.decode(errors="replace")
    report = json.loads(run.stdout)
    assert "fatal" not in report, report
    assert report["steps"] == STEPS, report
    return report


def sent(report: dict) -> list[dict]:
    return [entry["message"] for entry in report["wire"] if entry["dir"] == "out"]


def received(report: dict) -> list[dict]:
    return [entry["message"] for entry in report["wire"] if entry["dir"] == "in"]


def response_to(report: dict, request: dict) -> dict | None:
    for message in received(report):
        if "method" not in message and type(message.get("id")) is type(request["id"]) and message["id"] == request["id"]:
            return message
    return None


def call_request(report: dict, predicate) -> dict:
    matches = [m for m in sent(report) if m.get("method") == "tools/call" and predicate(m["params"])]
    assert len(matches) == 1, matches
    return matches[0]


@pytest.fixture(scope="module", params=RUNS, ids=[f"{sdk}-{mode}" for sdk, mode in RUNS])
def report(request, tmp_path_factory) -> dict:
    """One conversation per client and mode, judged by every test below."""
    sdk, mode = request.param
    files = tmp_path_factory.mktemp(f"{sdk}-{mode}") / "files"
    (files / "work").mkdir(parents=True)
    result = drive(files, sdk, mode)
    result["mode"] = mode
    # Every server it started, the auto probe's sibling included, is gone.
    wait_for(lambda: not server_processes(files), timeout=5, what="the servers to exit")
    return result


def expected_version(report: dict) -> str:
    return LEGACY if report["mode"] == "legacy" else MODERN


def test_the_client_negotiates_the_era_its_mode_asks_for(report):
    version = expected_version(report)
    if report["negotiated"] is not None:
        assert report["negotiated"] == version
    initialize = [m for m in sent(report) if m.get("method") == "initialize"]
    if version == LEGACY:
        assert len(initialize) == 1
        assert response_to(report, initialize[0])["result"]["protocolVersion"] == LEGACY
        assert report["serverVersion"]["name"] == "lnk-link-run"
    else:
        # The stateless era: no handshake on the session's process, every request in the envelope.
        assert initialize == []
        for message in sent(report):
            if "id" in message:
                assert message["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] == MODERN
        assert report["serverVersion"]["name"] == "lnk-link-run"
    assert report["connectMs"] < 5000


def test_every_modern_result_is_complete_and_names_the_server_and_no_legacy_one_is(report):
    if expected_version(report) == LEGACY:
        for message in received(report):
            if "result" in message:
                assert "resultType" not in message["result"], message
                assert "ttlMs" not in message["result"], message
        return
    for message in received(report):
        if "result" in message:
            assert message["result"]["resultType"] == "complete", message
            assert message["result"]["_meta"][SERVER_INFO_KEY]["name"] == "lnk-link-run"
    listing = [m for m in sent(report) if m.get("method") == "tools/list"]
    assert listing
    answer = response_to(report, listing[0])["result"]
    assert isinstance(answer["ttlMs"], int) and answer["ttlMs"] >= 0
    assert answer["cacheScope"] in ("public", "private")


def test_the_command_tool_is_listed_with_its_output_schema(report):
    tools = {tool["name"]: tool for tool in report["tools"]}
    assert "command" in tools
    command = tools["command"]
    assert command["hasOutputSchema"] and command["outputSchemaType"] == "object"
    assert command["title"]
    assert command["inputSchema"]["type"] == "object"
    assert "program" in command["inputSchema"]["required"]
    assert command["annotations"]["readOnlyHint"] is False


def test_a_call_with_meta_answers_text_and_structured_content_that_fits_the_schema(report):
    request = call_request(report, lambda p: p.get("arguments", {}).get("args") == ["hello", "from", report["sdk"]])
    # The client put our conversation keys in params._meta, beside its own.
    meta = request["params"]["_meta"]
    assert meta["link.local/thread"] == f"thread-{report['sdk']}"
    assert meta["link.local/hops"] == 1
    call = report["call"]
    assert call["isError"] is False and not call["hasIsErrorKey"]
    assert call["text"].startswith("exit 0 · ")
    assert f"hello from {report['sdk']}" in call["text"]
    structured = call["structuredContent"]
    assert structured["exit"] == 0 and structured["signal"] is None and structured["timed_out"] is False
    assert structured["output_bytes"] == len(f"hello from {report['sdk']}\n")
    listing = [m for m in sent(report) if m.get("method") == "tools/list"][0]
    schema = next(t for t in response_to(report, listing)["result"]["tools"] if t["name"] == "command")["outputSchema"]
    jsonschema.validate(structured, schema)


def test_a_refused_program_and_bad_arguments_are_tool_errors_not_protocol_errors(report):
    refusal = report["refusal"]
    assert refusal["isError"] is True
    assert "not-allowed-here" in refusal["text"] and "not allowed" in refusal["text"]
    assert refusal["structuredContent"] is None
    bad = report["badArguments"]
    assert bad["isError"] is True
    assert "args" in bad["text"]


def test_an_unknown_tool_is_an_invalid_params_error(report):
    thrown = report["unknownTool"].get("thrown")
    assert thrown is not None, report["unknownTool"]
    assert thrown["code"] == -32602
    assert "no_such_tool" in thrown["message"]


def test_progress_echoes_the_token_rises_and_stops_before_the_answer(report):
    progress = report["progress"]
    assert progress["result"]["isError"] is False
    events = progress["events"]
    assert len(events) >= 2, events
    values = [event["progress"] for event in events]
    assert values == sorted(set(values)), values
    assert values[-1] <= progress["result"]["structuredContent"]["output_bytes"]
    request = call_request(report, lambda p: "progressToken" in p.get("_meta", {}))
    token = request["params"]["_meta"]["progressToken"]
    wire = received(report)
    answered_at = next(i for i, m in enumerate(wire) if "method" not in m and m.get("id") == request["id"])
    notes = [(i, m) for i, m in enumerate(wire) if m.get("method") == "notifications/progress"]
    assert notes
    for index, note in notes:
        assert type(note["params"]["progressToken"]) is type(token)
        assert note["params"]["progressToken"] == token
        assert index < answered_at, "a progress notification came after the answer"
    # The client saw every one the server sent: none was unknown to it or reported as an error.
    assert len(events) == len(notes)
    assert report["errors"] == []


def test_a_cancelled_call_is_never_answered_and_its_group_is_killed(report):
    cancel = report["cancel"]
    assert "rejected" in cancel, cancel
    assert "user pressed stop" in cancel["rejected"]["message"]
    request = call_request(report, lambda p: p.get("arguments", {}).get("folder") == "work")
    notes = [m for m in sent(report) if m.get("method") == "notifications/cancelled"]
    assert [n["params"]["requestId"] for n in notes] == [request["id"]]
    assert response_to(report, request) is None
    for pid in cancel["pids"]:
        assert not pid_alive(pid)
    after = report["afterCancel"]
    assert after["isError"] is False and "still here" in after["text"]


def test_the_server_exits_0_on_its_own_when_the_client_closes_stdin(report):
    assert report["serverExit"] == {"code": 0, "signal": None}
    assert report["closeMs"] < CLIENT_CLOSE_PATIENCE_MS

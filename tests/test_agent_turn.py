"""One open-source coding agent's whole turn: Gemini CLI (pinned in
tests/node/package.json) runs `lnk-link-run up --no-way-in` from its project
settings, as a user sets it up (docs/clients.md), and talks to a stand-in
Gemini API of this test's own on 127.0.0.1.

The stand-in model asks for `command` with `python3 -c 'print(2**100)'`, then
records what the agent sends back as the tool's result: the printed number
must reach the model, and once.

Required when CI or LNK_REQUIRE_SANDBOX=1 is set (a missing Node or package
is then a failure); otherwise skipped without them. `tools/setup` installs
the agent when npm is there.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import SERVER, SYSTEM_PATH, require_sandbox
from node_helpers import NODE_DIR, need_node

pytestmark = [pytest.mark.node, pytest.mark.sandbox]

AGENT = NODE_DIR / "node_modules" / "@google" / "gemini-cli"
PRINTED = str(2**100)
# Gemini CLI names an MCP tool mcp_<server>_<tool>.
TOOL = "mcp_run_command"
MODEL = "gemini-2.5-flash"


def sse(chunk: dict) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\r\n\r\n"


def answer(parts: list[dict]) -> dict:
    return {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
            "modelVersion": MODEL}


def function_responses(request: dict) -> list[dict]:
    return [part["functionResponse"] for content in request["contents"] for part in content.get("parts", [])
            if "functionResponse" in part]


class StandInGemini(BaseHTTPRequestHandler):
    """Just enough of the Gemini API: a streamed turn asks for the tool until a result comes back, then ends."""

    turns: list[dict]  # each streamed request's body, in order

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if ":streamGenerateContent" not in self.path:
            # Side calls (the model router, checks): a plain text answer keeps the agent on its default path.
            self.reply(200, "application/json", json.dumps(answer([{"text": "{}"}])).encode())
            return
        self.turns.append(request)
        if function_responses(request):
            parts = [{"text": "done"}]
        else:
            parts = [{"functionCall": {"name": TOOL, "args": {
                "program": "python3", "args": ["-c", "print(2**100)"]}}}]
        self.reply(200, "text/event-stream", sse(answer(parts)))

    def do_GET(self) -> None:
        self.reply(404, "text/plain", b"")

    def reply(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stand_in() -> Iterator[tuple[str, list[dict]]]:
    turns: list[dict] = []
    handler = type("Recording", (StandInGemini,), {"turns": turns})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", turns
    server.shutdown()
    server.server_close()


def write_json(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))


def set_up_gemini(tmp_path: Path, server: list[str]) -> tuple[Path, Path]:
    """A home and a project, set up as docs/clients.md tells a user: the project's settings start the
    server, the folder is trusted, and the server's tools run without asking (headless, as `-p` is)."""
    home, project = tmp_path / "home", tmp_path / "project"
    write_json(project / ".gemini" / "settings.json", {
        "mcpServers": {"run": {"command": server[0], "args": server[1:], "trust": True}}})
    write_json(home / ".gemini" / "trustedFolders.json", {str(project): "TRUST_FOLDER"})
    write_json(home / ".gemini" / "settings.json", {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        "privacy": {"usageStatisticsEnabled": False}})
    return home, project


@pytest.mark.timeout(180)
def test_gemini_cli_gives_its_model_the_printed_number_once(tmp_path, stand_in):
    require_sandbox()
    node = need_node(AGENT / "bundle" / "gemini.js", "Gemini CLI is not installed in tests/node",
                     sandboxed=True)
    url, turns = stand_in
    # As a user runs it: up, with an agent folder of its own, for a plain client.
    server = SERVER + ["up", "--agent", str(tmp_path / "agent"), "--no-way-in"]
    home, project = set_up_gemini(tmp_path, server)
    env = {"HOME": str(home), "PATH": SYSTEM_PATH, "TERM": "dumb",
           "GOOGLE_GEMINI_BASE_URL": url, "GEMINI_API_KEY": "stand-in"}
    run = subprocess.run([node, str(AGENT / "bundle" / "gemini.js"), "-m", MODEL, "-p", "What is 2**100?"],
                         cwd=project, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=150)
    log = run.stdout.decode(errors="replace") + run.stderr.decode(errors="replace")
    assert run.returncode == 0, log
    assert len(turns) == 2, log
    declared = [f["name"] for tools in turns[0]["tools"] for f in tools.get("functionDeclarations", [])]
    assert TOOL in declared, declared
    (returned,) = function_responses(turns[1])
    assert returned["name"] == TOOL
    # The printed number reached the model in the tool's result, and nowhere else in what it was sent.
    assert json.dumps(returned).count(PRINTED) == 1, returned
    assert json.dumps(turns[1]).count(PRINTED) == 1, turns[1]
    assert "done" in run.stdout.decode()

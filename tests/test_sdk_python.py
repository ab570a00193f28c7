"""The official Python SDK (`mcp` 2.3.0) drives the server as a user's client
does, in each of its modes: "legacy" (the initialize handshake), "auto" (the
default: it probes server/discover and adopts the stateless era when offered)
and "2026-07-28" (the stateless era with no probe).

The client launches the server itself, with its own few environment
variables, and checks what it gets: structured content against the tool's
output schema, progress tokens against its requests.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import jsonschema
import pytest
from conftest import LEGACY, MODERN, pid_alive, serve_argv
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp_types import Implementation

MODES = ["legacy", "auto", MODERN]
META = {"link.local/thread": "thread-py", "link.local/hops": 1}
# The SDK closes stdin and gives the server 2 s before SIGTERM; ours leaves on EOF.
SDK_PATIENCE = 2.0

pytestmark = [pytest.mark.parametrize("mode", MODES)]


def negotiated(mode: str) -> str:
    return LEGACY if mode == "legacy" else MODERN


@asynccontextmanager
async def connected(files: Path, mode: str):
    argv = serve_argv(files, programs=("sh", "echo", "python3"))
    # No env: the SDK passes HOME, PATH and a few more, nothing of ours.
    params = StdioServerParameters(command=argv[0], args=argv[1:])
    async with Client(params, mode=mode, client_info=Implementation(name="linkrun-test-py", version="0")) as client:
        yield client


async def wait_until(condition, what: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await anyio.sleep(0.01)
    return value


def test_the_client_adopts_the_era_of_its_mode_and_sees_the_command_tool(files, mode):
    async def main():
        async with connected(files, mode) as client:
            assert client.protocol_version == negotiated(mode)
            if mode != MODERN:  # the pinned mode never asks: no discover, no initialize
                assert client.server_info.name == "lnk-link-run"
                assert "You may run sh, echo" in client.instructions
            page = await client.list_tools()
            assert page.next_cursor is None
            tools = {tool.name: tool for tool in page.tools}
            assert set(tools) == {"command"}
            command = tools["command"]
            assert command.title
            assert command.input_schema["type"] == "object"
            assert command.input_schema["required"] == ["program"]
            assert command.output_schema["type"] == "object"
            assert set(command.output_schema["required"]) >= {
                "exit", "signal", "timed_out", "output_bytes", "errors_bytes", "seconds"}
            assert command.annotations.read_only_hint is False

    anyio.run(main)


def test_a_call_with_meta_gets_text_and_structured_content_the_client_validated(files, mode):
    async def main():
        async with connected(files, mode) as client:
            page = await client.list_tools()  # the client validates against what it listed
            schema = page.tools[0].output_schema
            result = await client.call_tool("command", {"program": "echo", "args": ["hi", "there"]}, meta=META)
            assert result.is_error is False
            assert result.content[0].text.startswith("exit 0 · ")
            assert "hi there" in result.content[0].text
            structured = result.structured_content
            jsonschema.validate(structured, schema)
            assert structured | {"seconds": 0} == {
                "exit": 0, "signal": None, "timed_out": False, "output_bytes": 9, "errors_bytes": 0, "seconds": 0,
                "output": "hi there", "errors": "", "limit": None}

    anyio.run(main)


def test_the_structured_value_holds_what_the_program_printed(files, mode):
    # Structured-first clients (Claude Code, Codex, pydantic-ai) give the model this value alone.
    async def main():
        async with connected(files, mode) as client:
            await client.list_tools()
            return await client.call_tool("command", {"program": "python3", "args": ["-c", "print(2**100)"]})

    result = anyio.run(main)
    assert result.is_error is False
    assert result.structured_content["output"] == str(2**100)
    assert result.content[0].text.count(str(2**100)) == 1


def test_gemini_and_langchain_arguments_are_taken(files, mode):
    # Gemini CLI adds wait_for_previous; LangChain adapters send null for each optional argument.
    async def main():
        async with connected(files, mode) as client:
            await client.list_tools()
            return await client.call_tool("command", {"program": "echo", "args": ["taken"], "input": None,
                                                      "folder": None, "timeout": None, "wait_for_previous": True})

    result = anyio.run(main)
    assert result.is_error is False, result.content[0].text
    assert result.structured_content["output"] == "taken"
    assert result.structured_content["ignored"] == ["wait_for_previous"]


def test_a_refused_program_and_bad_arguments_are_error_results(files, mode):
    async def main():
        async with connected(files, mode) as client:
            refused = await client.call_tool("command", {"program": "rm", "args": ["-rf", "work"]}, meta=META)
            assert refused.is_error is True
            assert "'rm' is not allowed" in refused.content[0].text
            assert refused.structured_content is None
            bad = await client.call_tool("command", {"program": "echo", "timeout": "soon"})
            assert bad.is_error is True
            assert "timeout must be a number" in bad.content[0].text

    anyio.run(main)


def test_an_unknown_tool_raises_invalid_params(files, mode):
    async def main():
        async with connected(files, mode) as client:
            with pytest.raises(MCPError) as caught:
                await client.call_tool("no_such_tool", {})
            assert caught.value.code == -32602
            assert "no_such_tool" in caught.value.error.message

    anyio.run(main)


def test_progress_reaches_the_callback_and_rises(files, mode):
    seen = []

    async def on_progress(progress: float, total: float | None, message: str | None):
        seen.append((progress, total, message))

    async def main():
        async with connected(files, mode) as client:
            result = await client.call_tool(
                "command", {"program": "sh", "args": ["-c", "for i in 1 2 3 4; do echo line $i; sleep 0.3; done"]},
                progress_callback=on_progress)
            assert result.is_error is False
            return result.structured_content["output_bytes"]

    total = anyio.run(main)
    assert len(seen) >= 2, seen
    values = [progress for progress, _, _ in seen]
    assert values == sorted(set(values)), seen
    assert values[-1] <= total
    assert all(message.endswith("bytes of output so far") for _, _, message in seen)


def test_a_cancelled_call_kills_its_group_and_the_server_goes_on_then_leaves_on_eof(files, mode):
    pid_file = files / "work" / "cancel.pid"
    script = "sleep 30 & echo $PPID $$ $! > cancel.tmp; mv cancel.tmp cancel.pid; wait"

    async def main():
        async with connected(files, mode) as client:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as group:
                    async def call():
                        await client.call_tool("command", {"program": "sh", "args": ["-c", script], "folder": "work"})
                        raise AssertionError("the cancelled call was answered")

                    group.start_soon(call)
                    text = await wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), "the pid file")
                    # Cancelling the scope sends notifications/cancelled for the call.
                    scope.cancel()
            assert scope.cancelled_caught
            server, *group_pids = (int(pid) for pid in text.split())
            await wait_until(lambda: not any(pid_alive(pid) for pid in group_pids), "the call's group to die")
            after = await client.call_tool("command", {"program": "echo", "args": ["after"]})
            assert after.is_error is False and "after" in after.content[0].text
            assert pid_alive(server)
            closing = time.monotonic()
        return server, time.monotonic() - closing

    server, closing = anyio.run(main)
    assert not pid_alive(server)
    assert closing < SDK_PATIENCE, f"the server took {closing:.2f} s to leave on EOF: the SDK had to signal it"


def test_the_server_runs_with_only_the_variables_the_sdk_passes(files, mode):
    # The SDK passes HOME, LOGNAME, PATH, SHELL, TERM, USER: no LANG, no venv.
    async def main():
        async with connected(files, mode) as client:
            result = await client.call_tool("command", {"program": "echo", "args": ["naïve ☃"]})
            assert result.is_error is False
            assert "naïve ☃" in result.content[0].text
            return result.structured_content

    structured = anyio.run(main)
    assert structured["output_bytes"] == len("naïve ☃\n".encode())

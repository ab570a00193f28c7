"""A real structured-first agent library: pydantic-ai (its MCP toolset, over
FastMCP's stdio client) gives the model a tool's `structuredContent` alone
whenever the answer's other parts are text. A stand-in model (FunctionModel)
calls `command` and reads the tool return exactly as a model provider would
be sent it: the printed number must be there, once.
"""

from __future__ import annotations

import anyio
from conftest import SERVER, require_sandbox, serve_argv
from fastmcp.client import Client
from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from sandbox_helpers import Agent as AgentFolder

PRINTED = str(2**100)


def tool_returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]


def test_the_model_reads_the_printed_number_through_pydantic_ai(files):
    seen: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = tool_returns(messages)
        if not returns:
            # As a model does, with the optional arguments it was not given as null.
            return ModelResponse(parts=[ToolCallPart("command", {
                "program": "python3", "args": ["-c", "print(2**100)"], "input": None, "folder": None})])
        seen.append(returns[-1].model_response_str())  # what goes to the model's provider
        return ModelResponse(parts=[TextPart("done")])

    argv = serve_argv(files)
    toolset = MCPToolset(Client(StdioTransport(argv[0], argv[1:])))
    agent = Agent(FunctionModel(model), toolsets=[toolset])

    async def main():
        async with agent:
            return await agent.run("What is 2**100?")

    assert anyio.run(main).output == "done"
    (returned,) = seen
    assert returned.count(PRINTED) == 1, returned
    assert '"exit":0' in returned.replace(" ", "")  # the structured value, not the text


def test_the_model_reads_serves_note_once_through_pydantic_ai(tmp_path):
    """A note of serve's (here: the sandbox refused a write) reaches a
    structured-first client's model, once."""
    require_sandbox()
    box = AgentFolder(tmp_path)
    seen: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = tool_returns(messages)
        if not returns:
            return ModelResponse(parts=[ToolCallPart("command", {"program": "sh", "args": ["-c", "touch x"]})])
        seen.append(returns[-1].model_response_str())
        return ModelResponse(parts=[TextPart("done")])

    argv = SERVER + ["up", "--agent", str(box.root), "--sandbox", str(box.file)]
    toolset = MCPToolset(Client(StdioTransport(argv[0], argv[1:], env=box.env)))
    agent = Agent(FunctionModel(model), toolsets=[toolset])

    async def main():
        async with agent:
            return await agent.run("Make x.")

    assert anyio.run(main).output == "done"
    (returned,) = seen
    assert returned.count("[the sandbox refused a write: only work/ of the files folder is writable") == 1, returned
    assert returned.count("Read-only file system") == 1, returned  # the program's own line, once too

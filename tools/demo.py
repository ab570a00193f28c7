"""Drive Link Run with the official MCP Python client and show what an agent sees.

Runs `lnk-link-run up` (the launcher, on embedded defaults) in a fresh agent
folder unless --agent is given, lists the tools, and makes a few calls.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

CALLS = [
    ("a program", {"program": "python3", "args": ["-c", "print(2**100)"]}),
    ("a pipeline through sh -c", {"program": "sh", "args": ["-c", "ls / | wc -l"]}),
    ("a write outside the write folders", {"program": "sh", "args": ["-c", "echo hi > chats/note.txt"]}),
    ("a write in work/", {"program": "sh", "args": ["-c", "echo hi > work/note.txt && cat work/note.txt"]}),
    ("a timeout", {"program": "sh", "args": ["-c", "echo waiting; sleep 5"], "timeout": 1}),
    ("a program not allowed", {"program": "/usr/sbin/reboot"}),
]


async def main(agent: str) -> None:
    argv = ["-I", "-m", "linkrun", "up", "--agent", agent]
    params = StdioServerParameters(command=sys.executable, args=argv, env={"HOME": os.environ.get("HOME", "/")})
    async with Client(params) as client:
        print(f"connected: {client.server_info.name} {client.server_info.version}, protocol {client.protocol_version}\n")
        tools = await client.list_tools()
        print("tools:", ", ".join(tool.name for tool in tools.tools))
        for title, arguments in CALLS:
            print(f"\n── {title}: {arguments['program']} {' '.join(arguments.get('args', []))}")
            result = await client.call_tool("command", arguments)
            for block in result.content:
                print(block.text)
            if result.is_error:
                print("(a tool error: nothing ran)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agent", help="the agent's folder (default: a fresh one in a temporary folder)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="linkrun-demo-") as scratch:
        anyio.run(main, options.agent or os.path.join(scratch, "agent"))

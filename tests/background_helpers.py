"""Background commands as the tests drive them: serve's argv with background
flags, a start that must succeed, a read's answer and bytes, and waits on a
command's record."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import RawServer, serve_argv, text_of, wait_for

from linkrun.state import records

META = {"link.local/thread": "conversation-1"}
OTHER = {"link.local/thread": "conversation-2"}


def background_argv(files: Path, state: Path, *, running: str = "4", output: str = "16M", per_day: str = "100",
                    hops: str = "4", timeout: str = "1h", extra: tuple[str, ...] = ()) -> list[str]:
    return serve_argv(files, "--state", str(state), "--no-way-in", "--background", running,
                      "--background-timeout", timeout, "--background-output", output,
                      "--background-keep", "1d", "--background-per-day", per_day, "--hops", hops, *extra)


def start(server: RawServer, meta: dict = META, **arguments: object) -> str:
    """Start a background command; its id."""
    result = server.call("start", arguments, meta=meta)
    assert "isError" not in result, text_of(result)
    return result["structuredContent"]["id"]


def read(server: RawServer, **arguments: object) -> tuple[dict, str]:
    """A read's structured value and text."""
    result = server.call("read", arguments, meta=META)
    assert "isError" not in result, text_of(result)
    return result["structuredContent"], text_of(result)


def payload(value: dict, text: str) -> bytes:
    """The output bytes of a read's answer: its text's last next - offset bytes."""
    count = value["next"] - value["offset"]
    return text.encode()[-count:] if count else b""


def record(state: Path | str, command_id: str) -> dict | None:
    return records.load(str(state), command_id)


def wait_record(state: Path | str, command_id: str, condition: Callable[[dict], bool], what: str,
                timeout: float = 15) -> dict:
    """The command's record once `condition` holds for it."""
    return wait_for(lambda: (r := record(state, command_id)) and condition(r) and r, timeout=timeout, what=what)


def wait_ended(state: Path | str, command_id: str, timeout: float = 15) -> dict:
    return wait_record(state, command_id, lambda r: r["state"] not in records.RUNNING_STATES,
                       f"{command_id} to end", timeout)


def wait_running(state: Path | str, command_id: str, timeout: float = 15) -> dict:
    return wait_record(state, command_id, lambda r: r["state"] == "running", f"{command_id} to run", timeout)


@pytest.fixture
def bg(servers, files: Path, state: Path) -> RawServer:
    """A serve with background commands on, initialized (a fixture of every test module: conftest's pytest_plugins)."""
    server = servers(background_argv(files, state))
    server.initialize()
    return server

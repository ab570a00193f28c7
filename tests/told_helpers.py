"""Told messages as the tests drive them: the stand-in way in read message by
message, its keyring, a serve with a way in, a start, a sweep, and the
supervisor that holds a record's lock."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import SERVER, clean_env, serve_argv, text_of, wait_for
from standin_helpers import AGENT
from standin_helpers import WayIn as StandIn

from linkrun.state import layout, records

META = {"link.local/thread": "conversation-1", "link.local/hops": 1}


class WayIn(StandIn):
    """The stand-in way in of standin_helpers, read message by message."""

    def __init__(self, keyring: Path, *flags: str, address: str = "http://127.0.0.1:0/in"):
        super().__init__(keyring, address, *flags)
        self.taken = 0

    @property
    def received(self) -> list[dict]:
        return self.messages()

    def next(self, timeout=15.0) -> dict:
        wait_for(lambda: len(self.out) > self.taken, timeout=timeout, what="a message from the way in")
        self.taken += 1
        return self.received[self.taken - 1]

    def nothing_more(self) -> bool:
        return len(self.out) == self.taken


@pytest.fixture
def ways_in(keyring: Path):  # a fixture of every test module (conftest's pytest_plugins)
    """Yields a starter of stand-in ways in, and stops each it started."""
    started: list[WayIn] = []

    def start(*flags, address="http://127.0.0.1:0/in"):
        way_in = WayIn(keyring, *flags, address=address)
        started.append(way_in)
        return way_in

    yield start
    for way_in in started:
        way_in.stop()


def told_argv(files, state, keyring, address, keep="1d", timeout="1h"):
    return serve_argv(files, "--state", str(state), "--way-in", address, "--as", AGENT, "--keyring", str(keyring),
                      "--background", "4", "--background-timeout", timeout, "--background-output", "16M",
                      "--background-keep", keep, "--background-per-day", "100", "--hops", "4")


def start(server, **arguments) -> str:
    result = server.call("start", arguments, meta=META)
    assert "isError" not in result, text_of(result)
    return result["structuredContent"]["id"]


def wait_record(state, command_id, condition, what, timeout=15):
    return wait_for(lambda: (r := records.load(str(state), command_id)) and condition(r) and r,
                    timeout=timeout, what=what)


def sweep(state, *flags) -> subprocess.CompletedProcess:
    done = subprocess.run(SERVER + ["sweep", str(state), *flags], capture_output=True, text=True, timeout=60,
                          env=clean_env())
    assert done.returncode == 0, done.stderr
    return done


def supervisor_of_record(state, record) -> int:
    # The process holding the lock open that is a supervisor: a sweep, or serve, may have it open a moment too.
    lock = layout.path(str(state), record["id"], ".lock")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if b"supervise" not in cmdline.read().split(b"\0"):
                    continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == lock:
                    return int(pid)
        except OSError:
            continue
    raise AssertionError("no process holds the lock")

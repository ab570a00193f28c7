"""Caps and arguments: the day's cap counts every command that ran, even with
serve killed mid-start; arguments Linux cannot pass are refused before
anything runs; refusals quote a long value cut short. Real serve, real
supervisors, real signals."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
from conftest import wait_for
from test_background import background_argv

from linkrun import records

META = {"link.local/thread": "conversation-1"}
MAX_ARG_STRLEN = 128 * 1024  # Linux: one argument, its NUL included


@pytest.fixture
def state(tmp_path):
    folder = tmp_path / "state"
    yield folder
    for command_id in records.ids(str(folder)):
        if records.is_held(str(folder), command_id):
            records.write_stop(str(folder), command_id, "stopped")
    for command_id in records.ids(str(folder)):
        wait_for(lambda command_id=command_id: not records.is_held(str(folder), command_id), timeout=15,
                 what=f"the supervisor of {command_id} to end")


def counted_starts(state) -> int:
    try:
        return len([line for line in (state / "starts").read_text().splitlines() if line.strip()])
    except FileNotFoundError:
        return 0


def spawn_begun(state) -> bool:
    """serve opens the supervisor's log just before it spawns it."""
    try:
        return any(name.endswith(".log") for name in os.listdir(state))
    except FileNotFoundError:
        return False


# -- the day's cap ------------------------------------------------------------------------


def test_every_command_that_ran_is_counted_even_with_serve_killed_mid_start(servers, files, state):
    """SIGKILL serve within its start, 20 times: as the spawn begins and up to
    40 ms after the call was sent. A command that ran was counted."""
    marks = files / "work"
    rng = random.Random(14)
    for attempt in range(20):
        server = servers(background_argv(files, state))
        server.initialize()
        for name in os.listdir(state) if state.exists() else ():
            if name.endswith(".log"):
                os.unlink(state / name)  # the trigger below is a new log
        server.send({"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {
            "name": "start", "_meta": META,
            "arguments": {"program": "sh", "args": ["-c", 'echo ran > "work/ran-$1"', "sh", str(attempt)]}}})
        if attempt % 2:
            time.sleep(rng.uniform(0, 0.040))  # the race itself: no event to wait for
        else:
            wait_for(lambda process=server.process: spawn_begun(state) or process.poll() is not None, timeout=10,
                     interval=0.0005, what="serve to begin the spawn")
            time.sleep(rng.uniform(0, 0.003))
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
    wait_for(lambda: not any(records.is_held(str(state), i) for i in records.ids(str(state))), timeout=30,
             what="every supervisor to end")
    ran = len(list(marks.glob("ran-*")))
    assert ran > 0, "no start got as far as its command: the race was never run"
    assert counted_starts(state) >= ran, f"{ran} commands ran, {counted_starts(state)} starts were counted"

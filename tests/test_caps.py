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
from background_helpers import META, background_argv
from conftest import SERVER, require_sandbox, text_of, wait_for

from linkrun.state import records

MAX_ARG_STRLEN = 128 * 1024  # Linux: one argument, its NUL included


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


# -- arguments Linux cannot pass --------------------------------------------------------


def refused(result: dict) -> str:
    text = text_of(result)
    assert result.get("isError") is True and text.startswith("Refused: "), text[:300]
    return text


@pytest.mark.parametrize("tool", ["command", "start"])
def test_an_argument_over_linuxs_limit_is_refused_naming_it_before_anything_runs(bg, files, state, tool):
    long = "a" * 200_000
    result = bg.call(tool, {"program": "sh", "args": ["-c", "echo ran > work/ran", "sh", long]}, meta=META)
    text = refused(result)
    assert "argument 4 is 200000 bytes" in text and f"{MAX_ARG_STRLEN - 1} bytes" in text, text[:300]
    assert "input" in text  # what to do instead
    assert long[:1000] not in text
    assert not (files / "work" / "ran").exists()
    assert records.ids(str(state)) == [] and counted_starts(state) == 0


@pytest.mark.parametrize("tool", ["command", "start"])
def test_arguments_over_arg_max_together_are_refused_naming_it_before_anything_runs(bg, files, state, tool):
    arg_max = os.sysconf("SC_ARG_MAX")
    many = ["b" * 100_000] * (arg_max // 100_000 + 1)
    result = bg.call(tool, {"program": "sh", "args": ["-c", "echo ran > work/ran", "sh", *many]}, meta=META)
    text = refused(result)
    assert f"{arg_max} bytes" in text and "ARG_MAX" in text, text[:300]
    assert not (files / "work" / "ran").exists()
    assert records.ids(str(state)) == [] and counted_starts(state) == 0


def test_the_longest_argument_linux_passes_runs_in_command_and_in_start(bg, files, state):
    longest = "c" * (MAX_ARG_STRLEN - 1)
    result = bg.call("command", {"program": "sh", "args": ["-c", 'printf %s "$1" | wc -c', "sh", longest]})
    assert "isError" not in result, text_of(result)[:300]
    assert result["structuredContent"]["output"].strip() == str(len(longest))
    result = bg.call("start", {"program": "sh", "args": ["-c", 'printf %s "$1" | wc -c', "sh", longest]}, meta=META)
    assert "isError" not in result, text_of(result)[:300]
    command_id = result["structuredContent"]["id"]
    ended = wait_for(lambda: (r := records.load(str(state), command_id)) and r["state"] not in records.RUNNING_STATES
                     and r, what="the command to end")
    assert ended["exit"] == 0
    assert (files / "background" / f"{command_id}.out").read_text().strip() == str(len(longest))


# -- long values quoted cut short --------------------------------------------------------


TEN_MB = 10 * 1024 * 1024


@pytest.mark.parametrize("tool, arguments", [
    ("command", {"program": "x" * TEN_MB}),
    ("command", {"program": "/" + "x" * TEN_MB}),
    ("command", {"program": "sh", "folder": "y" * TEN_MB}),
    ("command", {"program": "sh", "folder": "work/" + "y" * TEN_MB}),
    ("start", {"program": "x" * TEN_MB}),
    ("read", {"id": "z" * TEN_MB}),
    ("stop", {"id": "z" * TEN_MB}),
])
def test_a_refusal_quotes_a_long_value_cut_short_and_says_its_length(bg, tool, arguments):
    result = bg.call(tool, arguments, meta=META, timeout=60)
    text = refused(result)
    assert len(text) < 1000, f"a {len(text)}-character refusal: {text[:200]}…"
    value = next(v for v in arguments.values() if len(v) >= TEN_MB)
    assert f"{len(value)} characters" in text, text[:300]
    assert "…" in text, text[:300]


def test_a_long_unknown_argument_is_named_cut_short(bg):
    result = bg.call("command", {"program": "true", "w" * TEN_MB: 1}, timeout=60)
    assert "isError" not in result, text_of(result)[:300]
    assert len(text_of(result)) < 1000 and f"{TEN_MB} characters" in text_of(result)
    assert len(str(result["structuredContent"]["ignored"])) < 200


def test_in_the_real_sandbox_its_own_arguments_count_and_the_longest_argument_runs(tmp_path, servers):
    from sandbox_helpers import Agent

    from linkrun.calls.setup import LAUNCH_RESERVE

    require_sandbox()
    agent = Agent(tmp_path)
    server = servers(SERVER + ["up", "--agent", str(agent.root), "--no-way-in"], env=agent.env)
    server.initialize()
    longest = "c" * (MAX_ARG_STRLEN - 1)
    result = server.call("command", {"program": "sh", "args": ["-c", 'printf %s "$1" | wc -c', "sh", longest]})
    assert "isError" not in result, text_of(result)[:300]
    assert result["structuredContent"]["output"].strip() == str(len(longest))
    # Arguments that alone fit, 1 KiB under the limit, but not with bwrap's own (its binds take more).
    limit = os.sysconf("SC_ARG_MAX") - LAUNCH_RESERVE
    pieces = [longest] * (limit // MAX_ARG_STRLEN)
    pieces.append("d" * (limit - 1024 - sum(len(p) + 9 for p in pieces)))
    result = server.call("command", {"program": "sh", "args": ["-c", "echo ran > work/ran", "sh", *pieces]})
    assert "ARG_MAX" in refused(result)
    assert not (agent.files / "work" / "ran").exists()

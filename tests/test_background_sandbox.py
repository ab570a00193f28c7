"""Background commands in the real sandbox: started through `up --no-way-in`,
with bubblewrap, its pid namespace and --new-session."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from background_helpers import META, start, wait_record
from conftest import parent_of, SERVER, pid_alive, require_sandbox, stop_what_runs, text_of, wait_for
from sandbox_helpers import Agent

from linkrun.state import layout
from linkrun.processes.spare import LOADER


@pytest.fixture
def box(tmp_path):
    require_sandbox()
    agent = Agent(tmp_path)
    yield agent
    stop_what_runs(agent.root / "State")


@pytest.fixture
def up(box, servers):
    server = servers(SERVER + ["up", "--agent", str(box.root), "--no-way-in"], env=box.env)
    server.initialize()
    return server


def state_of(box) -> str:
    return str(box.root / "State")


def program_pid(box, marker: str) -> int:
    path = box.files / "work" / marker
    wait_for(lambda: path.exists() and path.read_text().strip(), what=f"{marker} to be written")
    # The pid inside the sandbox's namespace is not the host's: find the host's by its
    # marker, and by its working folder (other tests' sandboxes have the same small pids).
    inside = path.read_text().strip()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            ns_pids = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
            if len(ns_pids) > 1 and ns_pids[-1] == inside and Path(f"/proc/{pid}/comm").read_text().strip() == "sh" \
                    and LOADER.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():  # not serve's spare
                try:
                    if os.readlink(f"/proc/{pid}/cwd") == str(box.files):
                        return int(pid)
                except OSError:
                    continue
    raise AssertionError("the program's host pid was not found")


def test_a_background_command_runs_in_the_sandbox_and_writes_only_work(up, box):
    command_id = start(up, program="sh", args=["-c", "echo inside > work/out; echo x > chats/no; echo done"])
    ended = wait_record(state_of(box), command_id, lambda r: r["state"] == "exited", "the end")
    assert (box.files / "work" / "out").read_text() == "inside\n"
    assert not (box.files / "chats" / "no").exists()
    output = (box.files / "background" / f"{command_id}.out").read_bytes()
    assert b"Read-only file system" in output and output.endswith(b"done\n")
    assert ended["exit"] == 0


def test_a_background_command_cannot_write_its_own_output_file(up, box):
    command_id = start(up, program="sh", args=["-c", "echo forged > background/$(ls background | head -1); echo $?"])
    wait_record(state_of(box), command_id, lambda r: r["state"] == "exited", "the end")
    output = (box.files / "background" / f"{command_id}.out").read_bytes()
    assert b"forged" not in output and b"Read-only file system" in output


def test_stop_gives_the_program_its_term_inside_the_sandbox_then_the_rest_dies(up, box):
    command_id = start(up, program="sh", args=["-c", (
        "trap 'echo got term; exit 7' TERM; echo $$ > work/pid; (sleep 100 &); while :; do sleep 0.05; done")])
    wait_record(state_of(box), command_id, lambda r: r["state"] == "running", "running")
    program = program_pid(box, "pid")
    result = up.call("stop", {"id": command_id}, meta=META)
    value = result["structuredContent"]
    assert value["state"] == "stopped"
    assert b"got term" in (box.files / "background" / f"{command_id}.out").read_bytes()
    assert not pid_alive(program)


def test_a_program_ended_by_its_stops_signal_is_said_so_though_the_sandbox_gives_an_exit(up, box):
    # A new user's trial: `python3 -m http.server`, stopped, was "stopped (exit 143)": the sandbox's init
    # passes a death by a signal on as 128 and its number.
    command_id = start(up, program="python3", args=["-c", "import time; print('up', flush=True); time.sleep(100)"])
    output = box.files / "background" / f"{command_id}.out"
    wait_for(lambda: output.exists() and b"up" in output.read_bytes(), what="the program to run")
    result = up.call("stop", {"id": command_id}, meta=META)
    assert result["structuredContent"]["exit"] == 143, result["structuredContent"]
    assert "stopped (exit 143: SIGTERM, its stop's)" in text_of(result), text_of(result)


def test_a_killed_supervisor_takes_the_whole_sandbox_with_it(up, box):
    command_id = start(up, program="sh", args=["-c", "echo $$ > work/pid; (setsid sleep 100 &); sleep 100"])
    running = wait_record(state_of(box), command_id, lambda r: r["state"] == "running", "running")
    program = program_pid(box, "pid")
    gate = running["leader_pid"]
    supervisor = parent_of(gate)
    os.kill(supervisor, signal.SIGKILL)
    wait_for(lambda: not pid_alive(program) and not pid_alive(gate), what="the sandbox to die with its supervisor")


def test_the_supervisor_loads_neither_the_server_nor_the_tools_nor_the_sandbox_builder(up, box):
    command_id = start(up, program="sh", args=["-c", "true"])
    log = Path(layout.path(state_of(box), command_id, ".log"))
    wait_for(lambda: log.exists() and "loaded" in log.read_text(), what="the supervisor's end")
    loaded = log.read_text().split("loaded ", 1)[1].split()
    for module in ("linkrun.front.server", "linkrun.front.tools", "linkrun.calls.caller", "linkrun.sandboxing.sandbox", "linkrun.up",
                   "linkrun.network.proxy",
                   "linkrun.detached.background", "linkrun.front.protocol"):
        assert module not in loaded
    assert "linkrun.state.records" in loaded


def test_a_background_command_starts_quickly_enough_to_be_worth_it(up, box):
    # Not a benchmark (tools/bench measures): a guard against a start that waits on something.
    started = time.monotonic()
    command_id = start(up, program="sh", args=["-c", "true"])
    assert time.monotonic() - started < 2
    wait_record(state_of(box), command_id, lambda r: r["state"] == "exited", "the end")

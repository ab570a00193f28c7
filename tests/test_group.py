"""The loop shared by a call and a background command, with real processes:
its staged stop, and the sandbox's init killed with the group."""

from __future__ import annotations

import os
import signal
import subprocess
import threading

import pytest
from conftest import pid_alive

from linkrun.processes.child import boottime
from linkrun.processes.group import Leader, Stage, Watch


@pytest.fixture
def stand_in_init():
    """A process standing in for the sandbox's pid 1: in a group of its own, as bwrap's init is."""
    process = subprocess.Popen(["sleep", "100"], process_group=0)
    yield process
    if process.poll() is None:
        process.kill()
    process.wait()


def watched(argv: list[str], init: subprocess.Popen | None = None) -> tuple[subprocess.Popen, Leader]:
    process = subprocess.Popen(argv, process_group=0)
    leader = Leader(process)
    if init is not None:
        leader.sandbox_init = os.pidfd_open(init.pid)  # set after the spawn, as serve would
    return process, leader


def test_the_sandbox_init_is_killed_when_the_leader_exits(stand_in_init):
    process, leader = watched(["sh", "-c", "exit 3"], stand_in_init)
    watch = Watch(leader, boottime() + 30, leftover_grace=1.0)  # a call's grace: the group itself waits
    watch.run()
    assert (watch.exit, watch.signal, watch.ending) == (3, None, None)
    assert stand_in_init.wait(timeout=10) == -signal.SIGKILL
    assert leader.pidfd is None and leader.sandbox_init is None  # both closed
    process.wait()


def test_a_stop_kills_the_sandbox_init_at_its_kill_stage_after_the_earlier_stages(stand_in_init):
    # The leader ignores TERM, so only the stop's KILL ends it.
    process, leader = watched(["sh", "-c", "trap '' TERM; while :; do sleep 1; done"], stand_in_init)
    said: list[str] = []
    termed: list[bool] = []

    def term() -> None:
        termed.append(pid_alive(stand_in_init.pid))  # the init still lives at the TERM
        os.killpg(leader.pgid, signal.SIGTERM)

    watch = Watch(leader, boottime() + 0.2, stages=(Stage("SIGTERM to the group", term, 0.3),), log=said.append)
    watch.run()
    assert watch.ending == "timed out" and watch.signal == signal.SIGKILL
    assert termed == [True]
    assert stand_in_init.wait(timeout=10) == -signal.SIGKILL
    assert said == [f"stopping (timed out): SIGTERM to the group, then SIGKILL to group {process.pid} in 0.3 s",
                    f"SIGKILL to group {process.pid}"]
    process.wait()


def test_without_a_sandbox_init_a_leader_that_exits_by_itself_is_not_killed():
    process, leader = watched(["true"])
    watch = Watch(leader, boottime() + 30, leftover_grace=1.0)
    watch.run()
    assert (watch.exit, watch.ending, leader.killed) == (0, None, False)
    process.wait()


def test_a_short_programs_few_bytes_and_its_end_are_not_held_by_the_pause_that_gathers_output(monkeypatch):
    # A small read pauses the loop so a trickle gathers; the leader's exit ends the pause.
    from linkrun.processes import group

    monkeypatch.setattr(group, "COALESCE", 30.0)
    process = subprocess.Popen(["sh", "-c", "echo hi; sleep 0.2"], process_group=0, stdout=subprocess.PIPE)
    leader = Leader(process)
    watch = Watch(leader, boottime() + 60)
    got: list[bytes] = []

    def sink(fd: int) -> int:
        data = os.read(fd, 1024)
        got.append(data)
        return len(data)

    assert process.stdout is not None
    watch.drain(process.stdout.fileno(), sink)
    started = boottime()
    watch.run()
    assert b"".join(got) == b"hi\n" and watch.exit == 0
    assert boottime() - started < 10, "the answer waited for the whole pause"
    process.stdout.close()
    process.wait()


def test_at_the_leaders_exit_the_output_is_read_without_waiting_for_the_sandbox_init_to_let_go_of_it(stand_in_init):
    # bwrap's init holds the program's output pipe (its stdio) until its
    # namespaces are torn down, after the program's end. Here the test holds
    # it, as long as it likes: all the program wrote is read, and the watch
    # ends at the exit, not at the pipe's end (which came 60 s later before).
    read_end, write_end = os.pipe()
    got = bytearray()
    running: threading.Thread | None = None

    def sink(fd: int) -> int:
        data = os.read(fd, 1 << 20)
        got.extend(data)
        return len(data)

    try:
        process = subprocess.Popen(["sh", "-c", "head -c 300000 /dev/zero; printf end"], process_group=0,
                                   stdout=write_end)
        leader = Leader(process)
        leader.sandbox_init = os.pidfd_open(stand_in_init.pid)
        watch = Watch(leader, boottime() + 120, leftover_grace=60.0)
        watch.drain(read_end, sink)
        running = threading.Thread(target=watch.run)
        running.start()
        running.join(timeout=30)
        assert not running.is_alive(), "the watch waited for the pipe's end"
        assert (watch.exit, watch.ending) == (0, None)
        assert len(got) == 300_003 and got.endswith(b"end")
        assert stand_in_init.wait(timeout=10) == -signal.SIGKILL
        process.wait()
    finally:
        os.close(write_end)
        if running is not None:
            running.join()
        os.close(read_end)

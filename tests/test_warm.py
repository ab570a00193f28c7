"""serve's warm fork server: supervisors forked ready-imported and ahead,
detached as booted ones are, and the booted way whenever it is not there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from background_helpers import background_argv, start, wait_ended, wait_running
from conftest import PASS_THROUGH, clean_env, parent_of, pid_alive, wait_for, warm_server

from linkrun.detached.warm import ANSWER_WAIT, FORKED
from linkrun.state import layout, records


def session_of(pid: int) -> int:
    return os.getsid(pid)


def ancestors(pid: int) -> list[int]:
    found = []
    while pid > 1:
        pid = parent_of(pid)
        found.append(pid)
    return found


def held_by(pid: int) -> list[str]:
    """What a process's descriptors point at, by number; one closed while we look is left out."""
    held = []
    for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
        try:
            held.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            pass
    return held


def log_path(state: Path, command_id: str) -> str:
    return layout.path(str(state), command_id, layout.LOG)


def log_of(state: Path, command_id: str) -> str:
    return Path(log_path(state, command_id)).read_text()


def warm_start(server, state: Path, **arguments: object) -> str:
    """A start through the warm fork server, once it is ready: the first
    starts may go the booted way while it imports, so `true` probes first."""
    def ready() -> bool:
        probe = start(server, program="true")
        wait_ended(state, probe)
        return FORKED in log_of(state, probe)

    wait_for(ready, what="the warm fork server to be ready")
    command_id = start(server, **arguments)
    wait_for(lambda: FORKED in log_of(state, command_id), what="a supervisor forked by the warm fork server")
    return command_id


def ready_warm_server(server, state: Path) -> int:
    """The warm fork server, once a start was forked by it."""
    warm_start(server, state, program="true")
    forks = warm_server(server.process.pid)
    assert forks is not None
    return forks


def test_a_warm_supervisor_is_detached_in_a_session_of_its_own_and_says_so(bg, files, state):
    server = bg
    command_id = warm_start(server, state, program="sleep", args=["100"])
    supervisor = parent_of(wait_running(state, command_id)["leader_pid"])
    assert server.process.pid not in ancestors(supervisor)  # nobody's child that waits, serve's least of all
    assert session_of(supervisor) not in (session_of(server.process.pid), session_of(warm_server(server.process.pid)))
    argv = Path(f"/proc/{supervisor}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
    at = argv.index("supervise")
    assert argv[at:at + 4] == ["supervise", command_id, "--state", str(state)]
    lock = layout.path(str(state), command_id, layout.LOCK)
    held = held_by(supervisor)
    assert held.count(lock) == 1 and os.readlink(f"/proc/{supervisor}/fd/0") == "/dev/null"  # held, off stdin
    assert [os.readlink(f"/proc/{supervisor}/fd/{fd}") for fd in (1, 2)] == ["/dev/null", log_path(state, command_id)]
    assert records.is_held(str(state), command_id)
    assert os.readlink(f"/proc/{warm_server(server.process.pid)}/fd/0") not in held  # its socket stays its own
    ended = wait_ended(state, start(server, program="sh", args=["-c", "echo warm"]))
    assert (ended["state"], ended["exit"]) == ("exited", 0)


def test_without_the_server_a_start_boots_its_supervisor(servers, files, state):
    server = servers(background_argv(files, state), env=clean_env(LNK_WARM_FORKS="0"))
    server.initialize()
    command_id = start(server, program="sh", args=["-c", "echo booted"])
    ended = wait_ended(state, command_id)
    assert (ended["state"], ended["exit"]) == ("exited", 0)
    assert (files / "background" / f"{command_id}.out").read_bytes() == b"booted\n"
    assert FORKED not in log_of(state, command_id)
    assert warm_server(server.process.pid) is None


def test_a_killed_server_is_replaced_and_every_start_still_runs(bg, files, state):
    server = bg
    first = ready_warm_server(server, state)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: not pid_alive(first), what="the server to die")
    command_id = start(server, program="sh", args=["-c", "echo after"])  # the booted way, at once
    ended = wait_ended(state, command_id)
    assert (ended["state"], ended["exit"]) == ("exited", 0)
    assert FORKED not in log_of(state, command_id)
    warm_start(server, state, program="true")  # a new server's
    assert warm_server(server.process.pid) not in (None, first)


@pytest.mark.parametrize("how", ["killed", "its input closed"])
def test_when_serve_ends_the_server_ends_and_supervisors_live_on(bg, files, state, how):
    server = bg
    command_id = warm_start(server, state, program="sh", args=["-c", "read line; echo got $line"], input="it\n")
    running = warm_start(server, state, program="sleep", args=["100"])
    supervisor = parent_of(wait_running(state, running)["leader_pid"])
    forks = warm_server(server.process.pid)
    assert forks is not None
    ahead, gate = ahead_and_gate(server, state)  # the next start's, waiting
    if how == "killed":
        server.process.kill()
    else:
        server.process.stdin.close()
    server.process.wait()
    wait_for(lambda: not pid_alive(forks), what="the server to end with serve")
    wait_for(lambda: not pid_alive(ahead), what="the supervisor ahead to end with the server")
    wait_for(lambda: not pid_alive(gate), what="its gate to end with it")
    assert pid_alive(supervisor)
    ended = wait_ended(state, command_id)
    assert (ended["state"], ended["exit"]) == ("exited", 0)
    assert (files / "background" / f"{command_id}.out").read_bytes() == b"got it\n"
    os.kill(supervisor, signal.SIGTERM)
    assert wait_ended(state, running)["state"] in ("lost", "stopped")


def test_serve_ending_while_the_server_boots_leaves_no_traceback(servers, files, state):
    server = servers(background_argv(files, state))
    server.initialize()
    forks = wait_for(lambda: warm_server(server.process.pid), what="the warm fork server, booting")
    server.close()  # before it said it was ready: its word to serve meets a closed socket
    wait_for(lambda: not pid_alive(forks), what="the server to end with serve")
    assert b"Traceback" not in server.stderr, server.stderr.decode()


def test_a_server_that_stops_answering_is_killed_and_the_start_boots_its_supervisor(bg, files, state):
    server = bg
    stuck = ready_warm_server(server, state)
    os.kill(stuck, signal.SIGSTOP)
    started = time.monotonic()
    command_id = start(server, program="sh", args=["-c", "echo after"])
    assert time.monotonic() - started < ANSWER_WAIT + 2
    ended = wait_ended(state, command_id)
    assert (ended["state"], ended["exit"]) == ("exited", 0)
    assert FORKED not in log_of(state, command_id)  # nothing the stopped server forked ran it
    wait_for(lambda: not pid_alive(stuck), what="the stopped server to be killed")
    warm_start(server, state, program="true")


# -- supervisors forked ahead ---------------------------------------------------------


def ahead_of(server, state: Path) -> int | None:
    """The supervisor the server forked ahead for `state`, waiting for a start: the server's words, neither
    the server nor a child of a process of ours (a fork on its way, or the gate a supervisor forked ahead)."""
    forks = warm_server(server.process.pid)
    words_of = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            words_of[int(name)] = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
    ours = {pid for pid, words in words_of.items() if str(state).encode() in words}

    def detached(pid: int) -> bool:
        try:
            return parent_of(pid) not in ours
        except OSError:  # gone meanwhile (its /proc entry missing, or read as it went)
            return False  # the server's intermediate fork, which exits at once

    found = [pid for pid in ours if b"warm-fork" in words_of[pid] and pid != forks and pid_alive(pid) and detached(pid)]
    return found[0] if len(found) == 1 else None


def test_a_start_is_handed_to_the_supervisor_forked_ahead_which_is_detached(bg, files, state):
    server = bg
    ready_warm_server(server, state)
    ahead, _ = ahead_and_gate(server, state)
    assert server.process.pid not in ancestors(ahead)  # nobody's child that waits, serve's least of all
    assert session_of(ahead) not in (session_of(server.process.pid), session_of(warm_server(server.process.pid)))
    held = held_by(ahead)
    assert not [path for path in held if str(state) in path or str(files) in path]  # nothing of any command yet
    command_id = start(server, program="sh", args=["-c", "echo ahead"])
    ended = wait_ended(state, command_id)
    assert (ended["state"], ended["exit"]) == ("exited", 0)
    assert FORKED in log_of(state, command_id)
    assert (files / "background" / f"{command_id}.out").read_bytes() == b"ahead\n"
    # The next start finds one forked ahead again, once the server had a quiet moment.
    wait_for(lambda: ahead_of(server, state) not in (None, ahead), what="the next supervisor forked ahead")


def children_of(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def ahead_and_gate(server, state: Path) -> tuple[int, int]:
    """The supervisor forked ahead, and the gate it forked ahead, once both wait."""
    def both() -> tuple[int, int] | None:
        ahead = ahead_of(server, state)
        gates = children_of(ahead) if ahead is not None else []
        return (ahead, gates[0]) if ahead is not None and len(gates) == 1 else None

    return wait_for(both, what="a supervisor forked ahead, and its gate")


def test_the_supervisor_ahead_runs_the_start_it_was_handed_in_the_gate_it_forked_ahead(bg, files, state):
    server = bg
    ready_warm_server(server, state)
    ahead, gate = ahead_and_gate(server, state)
    wait_for(lambda: os.getpgid(gate) == gate, what="its gate in a process group of its own")  # set just after the fork
    # It closes what it inherited just after: its socket, /dev/null and the server's stderr are left.
    held = wait_for(lambda: fds if len(fds := held_by(gate)) == 4 else None, what="the gate holding four descriptors")
    assert held[:2] == ["/dev/null"] * 2 and held[3].startswith("socket:")
    assert not [path for path in held if str(state) in path or str(files) in path]  # nothing of any command yet
    command_id = start(server, program="sleep", args=["100"])
    running = wait_running(state, command_id)
    supervisor = parent_of(running["leader_pid"])
    assert (supervisor, running["leader_pid"], running["group"]) == (ahead, gate, gate)
    argv = Path(f"/proc/{supervisor}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
    assert argv[argv.index("supervise"):][:2] == ["supervise", command_id]


def test_a_launch_too_large_to_hand_to_the_gate_ahead_runs_in_a_gate_forked_for_it(bg, files, state):
    server = bg
    ready_warm_server(server, state)
    ahead, gate = ahead_and_gate(server, state)
    words = ["x" * 100_000] * 3  # 300 kB: more than one message on a socketpair
    command_id = start(server, program="sh", args=["-c", 'echo "$#" "${#1}"', "sh", *words])
    ended = wait_ended(state, command_id)
    assert (ended["state"], ended["exit"]) == ("exited", 0)
    assert (files / "background" / f"{command_id}.out").read_bytes() == b"3 100000\n"
    assert ended["leader_pid"] != gate and not pid_alive(gate)  # the one ahead, unused, exited


SUPERVISE = """
import sys
from linkrun.detached.supervise import supervise
go = sys.argv[3] == "go"
sys.exit(supervise(sys.argv[1], sys.argv[2], "a test's", lambda: go))
"""


def supervise_with(state: Path, files: Path, go: bool, marker: Path) -> tuple[str, dict, int, int]:
    """A supervisor run on a new record, as one forked ahead runs it, told `go` or not: the record
    as written, the supervisor's exit and pid."""
    from linkrun.config import Limits

    state.mkdir(exist_ok=True)
    (files / "background").mkdir(exist_ok=True)
    command_id = records.new_id()
    lock = records.create_lock(str(state), command_id)
    try:
        record = records.new_record(
            command_id, argv=list(PASS_THROUGH), write=[], proxy=None, seccomp=None, files=str(files), folder="",
            program="sh", args=[], program_argv=["/bin/sh", "-c", f": > {marker}"], timeout=60, output=16384,
            background_output=16384, keep=60, way_in=None, agent=None, keyring=None, thread="conversation-1",
            hops=0, limits=Limits(tasks=64).as_record())
        records.write(str(state), command_id, record)
        log = os.open(log_path(state, command_id), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            supervisor = subprocess.Popen(
                [sys.executable, "-I", "-c", SUPERVISE, command_id, str(state), "go" if go else "no"],
                stdin=lock, stdout=subprocess.DEVNULL, stderr=log, env=clean_env())
        finally:
            os.close(log)
    finally:
        os.close(lock)
    return command_id, record, supervisor.wait(timeout=30), supervisor.pid


def groups_of(pid: int) -> list[str]:
    """The cgroups a process made (cgroups.py names them lnk-<pid>-<n>) that are still there."""
    from linkrun.sandboxing import cgroups

    return [os.path.join(parent, name) for parent in set(cgroups.place().folders.values())
            for name in os.listdir(parent) if name.startswith(f"lnk-{pid}-")]


def test_a_supervisor_ahead_that_gets_no_go_leaves_nothing_and_runs_nothing(files, state):
    marker = files / "ran"
    command_id, written, code, pid = supervise_with(state, files, False, marker)
    assert code == 0
    assert not marker.exists()  # its gate was let go of without `G`
    assert records.load(str(state), command_id) == written  # the record is serve's (or the next supervisor's)
    assert Path(log_path(state, command_id)).read_text() == ""  # not a line
    assert not (files / "background" / f"{command_id}.out").exists()
    assert not Path(layout.path(str(state), command_id, layout.WRITE)).exists()
    assert groups_of(pid) == []  # its cgroup, made for the gate, removed
    # The same run told to go runs the command: what was checked above is the no-go's doing.
    command_id, _, code, _ = supervise_with(state, files, True, marker)
    assert code == 0 and marker.exists(), Path(log_path(state, command_id)).read_text()
    ended = wait_ended(state, command_id)
    assert ended["state"] == "exited"
    assert (files / "background" / f"{command_id}.out").exists()
    from linkrun.config import Limits
    from linkrun.sandboxing import cgroups

    if cgroups.place().holds(Limits(tasks=64)):  # where groups can be made, the run made one: the no-go's was removed
        assert ended["cgroup"] is not None

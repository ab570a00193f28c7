"""A background command's sandbox made ahead (detached/spareahead.py): the
supervisor forked ahead makes it while it waits for its start, its loader
waiting for the program. Real `up`, real supervisors, real bubblewrap, as
root and as an ordinary user."""

from __future__ import annotations

import os
import signal

from ahead_helpers import MADE_AHEAD, children, comm, made_ahead
from conftest import pid_alive, text_of, wait_for
from up_harness import META, processes_with

from linkrun.state import layout

# What a program can see of its sandbox, but for what differs from one sandbox to the next, and
# its CPU time (an rlimit where no cgroup holds the cap: over the longest run, a call's or a command's).
PROBE = ("pwd; env | LC_ALL=C sort; ulimit -a | grep -v '^time'; grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status; "
         "ls /")


def log_of(up, command_id: str) -> str:
    return (up.state / f"{command_id}{layout.LOG}").read_text()


def output_of(up, command_id: str) -> str:
    up.wait_ended(command_id)
    return up.read(command_id)[0]["text"]


def gone(pid: int) -> bool:
    """Ended: a zombie counts, for an orphan is reaped by whatever reaper
    adopts it, which may be slow to: a container's init may reap on a timer."""
    return not pid_alive(pid)


def test_a_background_program_runs_in_the_sandbox_made_ahead_and_finds_what_a_call_finds(up_as):
    up = up_as
    up.wait_ended(up.start("sh", "-c", ":"))  # the warm fork server runs from serve's first answer
    wait_for(lambda: made_ahead(up.state), timeout=30, what="a sandbox made ahead")
    command_id = up.start("sh", "-c", f"read x; echo \"got $x\"; {PROBE}")
    result = up.server.call("write", {"id": command_id, "text": "it\n"}, meta=META, timeout=60)
    assert not result.get("isError"), text_of(result)
    printed = output_of(up, command_id)
    assert MADE_AHEAD in log_of(up, command_id)
    call = up.command("sh", "-c", PROBE)["structuredContent"]["output"]
    # Its folder, environment, limits, filter and binds (a call's answer drops its output's last newline).
    assert printed == "got it\n" + call + "\n", (printed, call)


def test_a_sandbox_made_ahead_that_no_longer_shows_what_one_made_now_would_is_not_taken(up_as):
    up = up_as
    up.wait_ended(up.start("sh", "-c", ":"))
    wait_for(lambda: made_ahead(up.state), timeout=30, what="a sandbox made ahead")
    work = up.agent / "Files" / "work"
    owner = work.stat()
    work.rename(work.with_name("work.old"))  # the write folder the sandbox made ahead binds
    work.mkdir()
    os.chown(work, owner.st_uid, owner.st_gid)
    stale = up.start("sh", "-c", "echo ran > work/ran; echo ran")
    assert output_of(up, stale) == "ran\n"
    assert "forked ahead" in log_of(up, stale) and MADE_AHEAD not in log_of(up, stale)
    assert (work / "ran").read_text() == "ran\n"  # the new folder, not the one it replaced
    wait_for(lambda: made_ahead(up.state), timeout=30, what="a sandbox made ahead of the new folder")
    fresh = up.start("sh", "-c", "cat work/ran")
    assert output_of(up, fresh) == "ran\n" and MADE_AHEAD in log_of(up, fresh)


def test_a_sandbox_made_ahead_ends_with_serve_or_with_its_supervisor_killed_and_its_group_goes(up_as):
    up = up_as
    up.wait_ended(up.start("sh", "-c", ":"))
    found = wait_for(lambda: made_ahead(up.state), timeout=30, what="a sandbox made ahead")
    supervisor, sandbox = found
    init = children(sandbox)
    assert groups_of(supervisor) or up.who == "user"  # as root, here, the limits hold through cgroups
    os.kill(supervisor, signal.SIGKILL)  # killed outright: its bwrap's death signal ends the sandbox
    wait_for(lambda: gone(sandbox) and all(map(gone, init)), what="the sandbox to end with its supervisor")
    # The warm fork server learns it is gone at the next start, which gets a supervisor forked then;
    # the next one ahead makes a sandbox, and its first group removes the orphan's.
    up.wait_ended(up.start("sh", "-c", ":"))
    wait_for(lambda: made_ahead(up.state), timeout=30, what="the next sandbox made ahead")
    wait_for(lambda: not groups_of(supervisor), what="the killed supervisor's groups to be removed")
    supervisor, sandbox = made_ahead(up.state)
    init = children(sandbox)
    up.server.close(timeout=15)  # serve's end: the warm fork server's, and the supervisor ahead's
    wait_for(lambda: gone(supervisor) and gone(sandbox) and all(map(gone, init)),
             what="the sandbox made ahead to end with serve")
    # The warm fork server ends once it reads serve's end of file, a moment after serve: waited for, not raced.
    try:
        wait_for(lambda: not running_with(str(up.state)), what="every process of the agent's to end")
    except AssertionError:
        raise AssertionError(f"still running after serve's end: {running_with(str(up.state))}") from None


def running_with(text: str) -> list[str]:
    """The processes whose command line holds `text`, as pid and command line, zombies left out."""
    found = []
    for pid in processes_with(text):
        try:
            if not gone(pid):
                found.append(f"{pid} {comm(pid)}")
        except OSError:
            continue
    return found


def groups_of(maker: int) -> list[str]:
    """The cgroups a process made (cgroups.make names them lnk-<its pid>-<n>), wherever they are."""
    found = []
    for folder, names, _ in os.walk("/sys/fs/cgroup"):
        found += [os.path.join(folder, name) for name in names if name.startswith(f"lnk-{maker}-")]
    return found

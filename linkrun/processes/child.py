"""Process-group plumbing shared by the runner and the supervisor.

Every deadline runs on CLOCK_BOOTTIME so that a suspended laptop's sleep
counts against a timeout; Python's waits have no timer on that clock, so
callers wait in slices of at most SLICE seconds and check the deadline at
each wake. Nothing here polls while nothing is in flight.
"""

from __future__ import annotations

import os
import signal
import time

SLICE = 1.0


def boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def exit_status(pidfd: int) -> tuple[int | None, int | None]:
    """(exit, signal) of an exited child, read without reaping it.

    The child stays a zombie until the caller reaps it, so its pid (and the
    process group id it leads) cannot be reused while leftovers are killed.
    """
    info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOWAIT)
    if info is None:  # not exited yet
        raise ChildProcessError("the child has not exited")
    if info.si_code == os.CLD_EXITED:
        return info.si_status, None
    return None, info.si_status


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Signal a process group; False when nothing of it is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def terminal_session(session: int) -> int | None:
    """The session a `tty` command's program runs in on its terminal, or None:
    its terminal's keeper (util-linux script, in `session` under bwrap's
    init) runs it in a session of its own, the first one met below. A SIGTERM
    to `session` would reach the keeper alone, which kills the program two
    seconds later and keeps nothing the program says meanwhile."""
    below = [session]
    for _ in range(3):  # bwrap's init, the keeper, the program
        found = []
        for pid in below:
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    found += [int(child) for child in f.read().split()]
            except (OSError, ValueError):
                continue
        for child in found:
            try:
                inner = os.getsid(child)
            except OSError:
                continue
            if inner != session:
                return inner
        below = found
    return None


def program_session(gate: int) -> int | None:
    """The session a background command's program runs in inside its sandbox (bwrap's --new-session), or
    None; `gate` is the gate's pid, which exec'd the outer bwrap.

    bwrap's pid 1 (the gate's only child) calls setsid and runs the program in
    its session; a SIGTERM to the gate's group would reach only the outer
    bwrap and tear the sandbox down with no grace. pid 1 itself ignores the
    TERM (a namespace's init does without a handler), so the program gets it
    first.
    """
    try:
        with open(f"/proc/{gate}/task/{gate}/children") as f:
            children = f.read().split()
        return os.getsid(int(children[0])) if children else None
    except (OSError, ValueError):
        return None

"""What the tests of a background command's sandbox made ahead share: finding it."""

from __future__ import annotations

import os

from up_harness import processes_with

MADE_AHEAD = "in its sandbox made ahead"  # the supervisor's log says so


def children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(child) for child in f.read().split()]
    return found


def comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


def made_ahead(state) -> tuple[int, int] | None:
    """The supervisor forked ahead for this agent (its command line still the
    warm fork server's) and the bwrap of its sandbox made ahead, once made."""
    for pid in processes_with(f"warm-fork\0{'-' * 16}\0--state\0{state}\0"):
        try:
            sandbox = [child for child in children(pid) if comm(child) == "bwrap"]
            # Its init runs its loader: the sandbox is made. Its init alone is not enough: until its
            # bwrap lets it go on, it waits, with no death signal yet (strays.py), and a supervisor
            # killed then leaves it waiting for the next start's or serve's sweep.
            if sandbox and any(children(init) for init in children(sandbox[0])):
                return pid, sandbox[0]
        except OSError:
            continue  # it ended, or started its command, while it was read
    return None

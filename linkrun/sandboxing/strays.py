"""Sandboxes of this agent that lost the process that launched them.

bwrap 0.8 sets its parent-death signal (`--die-with-parent`) a moment
after it starts, and its init sets its own only once bwrap let it go. A
serve or supervisor killed with SIGKILL in that moment leaves the sandbox
behind, nobody's: an init waiting forever, or a whole sandbox whose
program runs on without its timeout. serve ends those of its agent once,
after its first answer.

A stray is a bwrap of this user whose argv binds the agent's files folder
and watches its init (`--info-fd`: serve's calls and spares, a
supervisor's command; not `lnk-link-run sandbox`, which a person runs),
and whose parent is neither a bwrap nor Link Run. A live launch always
has one of those as its parent.
"""

from __future__ import annotations

import os
import signal

from ..kernel import read_small


def find(files: str) -> list[int]:
    """The strays of the agent whose files folder is `files`, outer bwraps and inits alike."""
    found = []
    wanted = files.encode()
    for name in os.listdir("/proc"):
        if name.isdigit() and _is_stray(int(name), wanted):
            found.append(int(name))
    return found


def end(files: str) -> int:
    """SIGKILL each stray and what runs below it; how many there were.

    Each is held by a pidfd and checked again before its signal, so a pid
    reused meanwhile is never the one killed. An init's end ends its pid
    namespace; an outer bwrap's init is killed with it."""
    ended = 0
    wanted = files.encode()
    for pid in find(files):
        for target in [*_children(pid), pid]:
            try:
                pidfd = os.pidfd_open(target)
            except OSError:
                continue  # ended already
            try:
                if target == pid and not _is_stray(pid, wanted):
                    continue
                if target != pid and not _is_bwrap(target):
                    continue
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                ended += target == pid
            except ProcessLookupError:
                pass
            finally:
                os.close(pidfd)
    return ended


def _is_stray(pid: int, files: bytes) -> bool:
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False
    except OSError:
        return False
    argv = _argv(pid)
    if not argv or os.path.basename(argv[0]) != b"bwrap" or b"--info-fd" not in argv or files not in argv:
        return False
    parent = _parent(pid)
    if parent is None:
        return False
    parent_argv = _argv(parent)
    launched_by_us = (parent_argv and os.path.basename(parent_argv[0]) == b"bwrap") or any(
        b"linkrun" in arg for arg in parent_argv)
    return not launched_by_us


def _is_bwrap(pid: int) -> bool:
    argv = _argv(pid)
    return bool(argv) and os.path.basename(argv[0]) == b"bwrap"


def _argv(pid: int) -> list[bytes]:
    data = read_small(f"/proc/{pid}/cmdline")
    return data.split(b"\0")[:-1] if data else []


def _parent(pid: int) -> int | None:
    stat = read_small(f"/proc/{pid}/stat")
    if stat is None:
        return None
    return int(stat[stat.rfind(b")") + 2:].split()[1])


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        data = read_small(f"/proc/{pid}/task/{task}/children")
        found += [int(child) for child in (data or b"").split()]
    return found

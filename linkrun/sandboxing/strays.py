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
whose parent is no bwrap (an init's is its bwrap), and whose parent does
not hold its output's pipe: the serve or supervisor that spawned a live
launch reads that pipe, a reaper that inherited an orphan does not.
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
    reused meanwhile is never the one killed; its children (an outer
    bwrap's init, which ends its pid namespace) are held before it dies."""
    ended = 0
    wanted = files.encode()
    for pid in find(files):
        held = _hold(pid)
        if held is None:
            continue
        try:
            if not _is_stray(pid, wanted):
                continue
            below = []
            for child in _children(pid):  # its init, checked once held: the pid is its for sure then
                pidfd = _hold(child)
                if pidfd is not None and _is_bwrap(child) and _parent(child) == pid:
                    below.append(pidfd)
                elif pidfd is not None:
                    os.close(pidfd)
            for pidfd in [held, *below]:
                try:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                except ProcessLookupError:
                    pass  # ended already
            for pidfd in below:
                os.close(pidfd)
            ended += 1
        finally:
            os.close(held)
    return ended


def _hold(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None  # ended already


def _is_stray(pid: int, files: bytes) -> bool:
    if _real_uid(pid) != os.getuid():
        return False
    argv = _argv(pid)
    if not argv or os.path.basename(argv[0]) != b"bwrap" or b"--info-fd" not in argv or files not in argv:
        return False
    parent = _parent(pid)
    if parent is None or _is_bwrap(parent):
        return False  # a sandbox's init under its bwrap
    return not _reads_its_output(parent, pid)


def _reads_its_output(parent: int, pid: int) -> bool:
    """The parent holds the pipe of the bwrap's output: the serve or the
    supervisor that spawned it and watches it, however it was started. A
    reaper that inherited an orphan holds none. Unknown (True) when the
    output is no pipe: nothing of Link Run's launches so."""
    try:
        output = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return True
    if not output.startswith("pipe:"):
        return True
    if _real_uid(parent) != os.getuid():
        return False  # a launcher of ours runs as us: this is a reaper (init, or a subreaper of root's)
    try:
        held = os.listdir(f"/proc/{parent}/fd")
    except OSError:
        return True  # gone meanwhile, or not to be looked into: not ours to judge
    for fd in held:
        try:
            if os.readlink(f"/proc/{parent}/fd/{fd}") == output:
                return True
        except OSError:
            pass
    return False


def _real_uid(pid: int) -> int | None:
    status = read_small(f"/proc/{pid}/status")
    at = status.find(b"\nUid:") if status is not None else -1
    if status is None or at < 0:
        return None
    return int(status[at + 5:status.find(b"\n", at + 1)].split()[0])


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

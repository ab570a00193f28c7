"""The sandbox's init, from bwrap's `--info-fd`: its host pid read and held by a pidfd.

A SIGKILL to that init from outside ends its pid namespace, and everything
in it, always (launch.py says why `--die-with-parent` alone is not enough).
"""

from __future__ import annotations

import os
import re

from ..kernel import read_small

INFO_LIMIT = 4096  # bwrap's info is one small JSON object


def init_pidfd(info_r: int) -> tuple[int | None, int | None]:
    """Read `{"child-pid": N}` from bwrap's info pipe and hold N by a pidfd.

    bwrap writes the pid as soon as its init exists, and the namespaces' ids
    only once they are set up: the read stops at the pid. Once held, the pid
    is checked to be a pid namespace's init (its parent may have changed
    already, if a program cut it loose), so a pid reused meanwhile by a process
    of the host is never the one killed.
    """
    data = b""
    pid = None
    while pid is None and len(data) < INFO_LIMIT:
        chunk = os.read(info_r, INFO_LIMIT)
        if not chunk:
            break
        data += chunk
        pid = _child_pid(data)
    if pid is None:
        return None, None
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None, None  # ended already: its namespace with it
    if not _is_namespace_init(pid):
        os.close(pidfd)
        return None, None
    return pidfd, pid


def _child_pid(info: bytes) -> int | None:
    match = re.search(rb'"child-pid"\s*:\s*(\d+)\s*[,}]', info)
    return int(match[1]) if match else None


def _is_namespace_init(pid: int) -> bool:
    status = read_small(f"/proc/{pid}/status")
    at = status.find(b"\nNSpid:") if status is not None else -1
    if status is None or at < 0:
        return False
    ns_pids = status[at + 7:status.find(b"\n", at + 1)].split()  # its pid in each namespace, ours first
    return len(ns_pids) > 1 and ns_pids[-1] == b"1"

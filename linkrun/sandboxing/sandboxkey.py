"""A sandbox's key: what its argv shows, by identity, so that a spare made
ahead is taken only by a call whose sandbox would show the same (spare.py)."""

from __future__ import annotations

import os
from collections.abc import Sequence

_BY_FD = {"--bind-fd", "--ro-bind-fd", "--seccomp"}
BINDS_BY_PATH = {"--bind", "--ro-bind", "--dev-bind", "--bind-try", "--ro-bind-try", "--dev-bind-try"}


def shown(args: Sequence[str]) -> tuple[object, ...]:
    """What a sandbox argv shows, for telling two launches apart: the argv
    with each bound folder or file named by its identity (and the filter by
    its size and time too: bwrap reads it), a descriptor's number dropped.
    The caller leaves out `--chdir`: a spare enters the call's folder itself."""
    key: list[object] = []
    at = 0
    while at < len(args):
        flag = args[at]
        key.append(flag)
        if flag in _BY_FD:
            info = os.fstat(int(args[at + 1]))
            key.append((info.st_dev, info.st_ino) + ((info.st_size, info.st_mtime_ns) if flag == "--seccomp" else ()))
            at += 1
        elif flag in BINDS_BY_PATH:
            try:
                info = os.stat(args[at + 1])
                key.append((info.st_dev, info.st_ino))
            except OSError:
                key.append(None)
        at += 1
    return tuple(key)

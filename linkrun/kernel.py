"""What `os` lacks for speaking to the kernel: a small kernel file read in
one call, and the libc functions `os` has no wrapper for (`tee`,
`renameat2`, inotify's), through ctypes, loaded at the first use, so a
process that needs none never loads it. Stdlib only."""

from __future__ import annotations

import functools
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ctypes


def read_small(path: str, limit: int = 1 << 16) -> bytes | None:
    """A kernel file of at most `limit` bytes (a cgroup's counters, a
    process's status), with one open and one read, not a buffered file's
    extra calls; None when it cannot be read (gone, say)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


@functools.cache
def libc() -> ctypes.CDLL:
    """The C library, its functions keeping `errno` for `last_errno`."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def last_errno() -> int:
    """The `errno` the last libc function called through `libc()` left on this thread."""
    import ctypes

    return ctypes.get_errno()

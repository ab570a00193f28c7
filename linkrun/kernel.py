"""What `os` lacks for speaking to the kernel: a small kernel file read in
one call or held for reading again, a process's stat fields, a buffer written whole, and the libc functions `os` has no wrapper for (`tee`,
`renameat2`, inotify's, `keyctl` through `syscall`), through ctypes, loaded at the first use, so a
process that needs none never loads it. Stdlib only."""

from __future__ import annotations

import errno
import functools
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ctypes
    from collections.abc import Callable


def write_all(fd: int, data: bytes, after_each: Callable[[], None] | None = None) -> None:
    """All of `data`, however many writes it takes (a pipe or a signal may
    cut one short); `after_each` runs after each write that moved bytes."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
        if after_each is not None:
            after_each()


def process_stat(pid: int, task: int | str | None = None) -> list[bytes] | None:
    """The fields of a process's /proc stat after its name (its state first: b"S", b"Z"…), or of one of
    its threads' (`task`), or None when it is gone. Raises PermissionError where /proc hides it."""
    try:
        with open(f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


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


class HeldFiles:
    """Kernel files read again and again (a kept cgroup's counters, a spare's status): each
    opened at its first read (or `hold`) and read again at 0, where the kernel writes it
    afresh, one syscall a look rather than three. A missing one is not looked
    for again. `close` lets go of them all."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}  # -1: missing

    def hold(self, path: str) -> None:
        """Opened now, read at the first `read`: a /proc file so opened stays
        bound to its process, and the kernel writes its text only when read."""
        if path not in self._fds:
            try:
                self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._fds[path] = -1  # never opened later: it would not be bound to the same process

    def read(self, path: str, limit: int = 1 << 16) -> str:
        """Its text; empty when it cannot be read."""
        fd = self._fds.get(path)
        try:
            if fd is None:
                fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            return os.pread(fd, limit, 0).decode() if fd >= 0 else ""
        except FileNotFoundError:
            self._fds[path] = -1
            return ""
        except OSError:
            return ""

    def close(self) -> None:
        while self._fds:
            if (fd := self._fds.popitem()[1]) >= 0:
                os.close(fd)


@functools.cache
def libc() -> ctypes.CDLL:
    """The C library, its functions keeping `errno` for `last_errno`."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


# inotify(7)'s event bits, for `inotify` (the /etc view's watch, the programs path's).
IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_Q_OVERFLOW, IN_IGNORED, IN_DONT_FOLLOW = 0x4000, 0x8000, 0x2000000


def inotify(function: str, *args: int | bytes) -> int:
    """Call one of libc's inotify functions (`inotify_init1`, `inotify_add_watch`); OSError when it fails."""
    result: int = getattr(libc(), function)(*args)
    if result < 0:
        number = last_errno()
        raise OSError(number, os.strerror(number))
    return result


def last_errno() -> int:
    """The `errno` the last libc function called through `libc()` left on this thread."""
    import ctypes

    return ctypes.get_errno()


# keyctl(2)'s number (glibc has no wrapper; libkeyutils, not always there,
# has one): x86_64's table, and the generic table that aarch64 and riscv64 use.
KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219}
KEYCTL_JOIN_SESSION_KEYRING = 1
_NO_KEYS = (errno.ENOSYS, errno.EPERM, errno.EACCES)  # no keys in this kernel, or keyctl refused to us


def own_session_keyring() -> bool:
    """This thread joins a new session keyring, anonymous and empty; what it
    spawns next inherits it, in place of the caller's (a thread's keyrings
    are its own credentials: the process's other threads keep theirs).

    False where it cannot be had, and need not: a kernel without keys, or a
    seccomp filter around us that refuses `keyctl` (as Docker's does), which
    refuses it in the sandbox as well; or a machine whose syscall table we
    do not hold. OSError for any other failure."""
    import ctypes

    number = KEYCTL.get(os.uname().machine)
    if number is None:
        return False
    call = libc().syscall
    call.restype = ctypes.c_long
    if call(ctypes.c_long(number), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), ctypes.c_char_p(None)) >= 0:
        return True
    failure = last_errno()
    if failure in _NO_KEYS:
        return False
    raise OSError(failure, os.strerror(failure))

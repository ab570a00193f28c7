"""The ways a writer of the state folder touches a file: a whole write and a
flock. Every writer uses these, so every file has the same durability.

stdlib only, and no `typing`: the supervisor imports it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

from ..kernel import write_all


def write_whole(path: str, data: bytes, mode: int = 0o600, synced: bool = True) -> None:
    """`path` holds `data` whole or not at all, and survives a crash once
    this returns: written beside under a name of its own (`<path>.<hex>.tmp`,
    so two writers never share one, and a sweep finds what a cut-short write
    left), synced, renamed into place, the folder synced. Not `synced`: whole
    or not at all all the same, to every process, but a crash of the machine may lose it."""
    temporary = f"{path}.{os.urandom(4).hex()}.tmp"  # secrets' way, without its imports on up's start
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask
        write_all(fd, data)
        if synced:
            os.fdatasync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(temporary)
        raise
    os.close(fd)
    os.rename(temporary, path)
    if synced:
        sync_folder(os.path.dirname(path) or ".")


def sync_folder(folder: str) -> None:
    """A rename is durable only once its folder is synced."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Held(Exception):
    """`hold` could not take a lock within its wait: another process holds it."""

    def __init__(self, path: str):
        super().__init__(f"{path} is held by another process")
        self.path = path


@contextlib.contextmanager
def hold(path: str, shared: bool = False, wait: float | None = None) -> Iterator[int]:
    """The flock of `path` (created 0600 when missing), held while the block
    runs; yields its descriptor. `wait` None blocks until it is taken; a
    number of seconds retries without blocking that long (0: one try), then
    raises Held. Closing the descriptor releases it, however the block ends."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        _take(fd, path, fcntl.LOCK_SH if shared else fcntl.LOCK_EX, wait)
        yield fd
    finally:
        os.close(fd)


def _take(fd: int, path: str, kind: int, wait: float | None) -> None:
    if wait is None:
        fcntl.flock(fd, kind)
        return
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise Held(path) from None
            time.sleep(0.01)  # flock has no timed wait: retry without blocking


def is_held(path: str) -> bool:
    """True while another process holds the flock of `path` (created when missing)."""
    try:
        with hold(path, wait=0):
            return False
    except Held:
        return True

"""The capped output file of a background command, `background/<id>.out`.

The file always holds the bytes [kept_from, total) of the command's output.
When it reaches twice the cap, its newest `cap` bytes are copied into
`<id>.out.next`, the record learns the new file's inode and `kept_from`, and
the new file is renamed over the old (step 5, (a) to (e)): a reader that
finds an inode other than the record's loads the record again, and so never
reads at a stale offset. Opened relative to the folder's descriptor and never
through a link.

A file's `kept_from` never changes once a reader may see it: the record
names the current file and the one before it (`prev_inode`,
`prev_kept_from`), so a reader that opened either between (c) and (d) still
reads at the right offset. On a full disk nothing is ever written with a gap:
the output is dropped (and counted) until a new, empty file can take the old
one's place, at the offset where the output then is.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import Any

from ..state import layout
from ..kernel import last_errno, libc
from ..processes.group import CHUNK
from .outread import open_background

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..state.records import Rotated
    from .linescan import LineScan

# Read and write: a rotation copies the newest bytes out of the old file.
OPEN_NEW = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
RETRY_FULL_DISK = 1.0  # seconds between tries while a disk is full
FULL = (errno.ENOSPC, errno.EDQUOT)
ROOM_MARGIN = 64 * 1024  # left free when a rotation on a full disk keeps what fits


class OutputFile:
    def __init__(self, folder_fd: int, name: str, fd: int, cap: int, on_rotate: Callable[[Rotated], None],
                 log: Callable[[str], None] = lambda text: None):
        self.folder_fd = folder_fd
        self.name = name
        self.fd = fd
        self.cap = cap
        self.on_rotate = on_rotate  # writes these fields into the record, step (c)
        self.log = log
        self.inode = os.fstat(fd).st_ino
        self.size = 0  # bytes in the current file
        self.kept_from = 0
        self.total = 0
        self.dropped = 0  # bytes lost to a full disk
        self.dropping = False  # a disk was full: output is dropped until a new file can start
        self.retry_at = 0.0  # no rotation is tried before this (monotonic) time
        self.splice = True
        self.buffer: bytearray | None = None
        self.null: int | None = None
        self.scan: LineScan | None = None  # told of each write and each new file, with a tell_on pattern

    @classmethod
    def create(cls, files: str, command_id: str, cap: int, on_rotate: Callable[[Rotated], None],
               log: Callable[[str], None] = lambda text: None) -> OutputFile:
        folder_fd = open_background(files)
        name = layout.output_name(command_id)
        try:
            fd = os.open(name, OPEN_NEW, 0o644, dir_fd=folder_fd)
        except BaseException:
            os.close(folder_fd)
            raise
        return cls(folder_fd, name, fd, cap, on_rotate, log)

    def pump(self, pipe_fd: int) -> int:
        """Move what the pipe holds into the file; the bytes moved, 0 at EOF.

        A full disk never blocks the pipe (it would stall the program): the
        output is dropped, and each second a new empty file is tried.
        """
        if self.dropping and not self._resume():
            return self._drop(pipe_fd)
        try:
            moved = self._splice(pipe_fd) if self.splice else self._copy(pipe_fd)
        except OSError as error:
            if error.errno not in FULL:
                raise
            self._disk_full()
            return self._drop(pipe_fd)
        if moved and self.scan is not None:
            self.scan.moved(moved)
        if moved and not self.dropping and self.size >= 2 * self.cap and time.monotonic() >= self.retry_at:
            self._rotate()
        return moved

    def _splice(self, pipe_fd: int) -> int:
        try:
            moved = os.splice(pipe_fd, self.fd, CHUNK)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            self.splice = False  # this filesystem refuses splice: copy instead
            return self._copy(pipe_fd)
        self.total += moved
        self.size += moved
        return moved

    def _copy(self, pipe_fd: int) -> int:
        if self.buffer is None:
            self.buffer = bytearray(CHUNK)
        count = os.readv(pipe_fd, [self.buffer])
        view = memoryview(self.buffer)[:count]
        while view:
            try:
                written = os.write(self.fd, view)
            except OSError as error:
                if error.errno not in FULL:
                    raise
                # What was read and not written is dropped: the pipe no longer holds it.
                self.total += len(view)
                self.dropped += len(view)
                self._disk_full()
                break
            self.total += written
            self.size += written
            view = view[written:]
        return count

    def _drop(self, pipe_fd: int) -> int:
        if self.null is None:
            self.null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        moved = os.splice(pipe_fd, self.null, CHUNK)
        self.total += moved
        self.dropped += moved
        return moved

    def _disk_full(self) -> None:
        if not self.dropping:
            self.log(f"the disk of the output is full: output is dropped, and a new file tried each "
                     f"{RETRY_FULL_DISK:g} s (at byte {self.total})")
        self.dropping = True
        self.retry_at = time.monotonic() + RETRY_FULL_DISK

    def _resume(self) -> bool:
        """After a full disk: a new, empty file starts where the output now is."""
        if time.monotonic() < self.retry_at:
            return False
        if not self._restart(keep=0):
            self.retry_at = time.monotonic() + RETRY_FULL_DISK
            return False
        self.dropping = False
        self.log(f"writing the output again from byte {self.total}; {self.dropped} bytes dropped so far")
        return True

    def _rotate(self) -> None:
        """At twice the cap: keep the newest `cap` bytes; on a disk with no room
        for their copy, as many as there is room for, or none, rather than
        stop; when even that fails, try again later."""
        if self._restart(keep=self.cap):
            return
        room = os.fstatvfs(self.fd)
        fits = max(0, min(self.cap, room.f_bavail * room.f_frsize - ROOM_MARGIN))
        for keep in dict.fromkeys((fits, 0)):
            if self._restart(keep=keep):
                self.dropped += self.cap - keep  # what the cap would have kept
                self.log(f"the disk of the output is full: the rotation kept its last {keep} bytes, "
                         f"not {self.cap}")
                return
        self.retry_at = time.monotonic() + RETRY_FULL_DISK

    def _restart(self, keep: int) -> bool:
        """Steps (a) to (e): a new file holding the newest `keep` bytes takes the
        old one's place. False, with nothing changed, when it cannot."""
        keep = min(keep, self.size)
        next_name = self.name + ".next"  # layout.next_output_name
        try:
            _unlink(next_name, self.folder_fd)  # what a rotation cut short left
            new_fd = os.open(next_name, OPEN_NEW, 0o644, dir_fd=self.folder_fd)  # (a)
        except OSError as error:
            self.log(f"cannot start a new output file: {error}")
            return False
        try:
            offset = self.size - keep
            while keep - (copied := os.lseek(new_fd, 0, os.SEEK_CUR)) > 0:  # (b)
                if os.copy_file_range(self.fd, new_fd, keep - copied, offset + copied) == 0:
                    break
            kept_from = self.total - keep
            inode = os.fstat(new_fd).st_ino
            self.on_rotate({"inode": inode, "kept_from": kept_from, "prev_inode": self.inode,  # (c)
                            "prev_kept_from": self.kept_from, "dropped": self.dropped})
            swapped = _take_place(next_name, self.name, self.folder_fd)  # (d)
        except BaseException as error:
            os.close(new_fd)
            _unlink(next_name, self.folder_fd)
            if not isinstance(error, OSError):
                raise
            self.log(f"cannot rotate the output file: {error}")
            return False
        if swapped:
            try:
                _unlink(next_name, self.folder_fd)  # the old file, swapped out; else the next (a) removes it
            except OSError as error:
                self.log(f"cannot remove the old output file: {error}")
        if self.scan is not None:
            self.scan.new_file(new_fd, kept_from)  # the old one is final: the scan may read it to its end
        os.close(self.fd)  # (e)
        self.fd, self.inode, self.kept_from, self.size = new_fd, inode, kept_from, keep
        return True

    def last(self, size: int) -> bytes:
        """The last `size` bytes written that the current file still holds (before `finish`)."""
        try:
            return os.pread(self.fd, size, max(0, self.size - size))
        except OSError:
            return b""

    def finish(self) -> None:
        """At the end, cut once more: the last `cap` bytes are kept, never more
        (on a full disk, more rather than none). After a full disk the file
        must end where the output ends: a new empty one, if it can."""
        if self.dropping:
            self.retry_at = 0.0
            self._resume()
        elif self.size > self.cap:
            self._restart(keep=self.cap)
        os.close(self.fd)
        os.close(self.folder_fd)
        if self.null is not None:
            os.close(self.null)


def _take_place(new_name: str, name: str, folder_fd: int) -> bool:
    """`new_name` takes `name`'s place at once: swapped with it where the
    filesystem can (True: the old file is now `new_name`), else renamed over
    it. A rename over a file makes ext4 write the new file to disk at once
    (auto_da_alloc), though the next rotation frees most kept halves unwritten."""
    if _exchange(new_name, name, folder_fd):
        return True
    os.rename(new_name, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    return False


RENAME_EXCHANGE = 2
_renameat2: list[Any] = []  # once looked up: [renameat2], or [None] where there is none


def _exchange(first: str, second: str, folder_fd: int) -> bool:
    """renameat2(RENAME_EXCHANGE), which os lacks. False where the system or
    the filesystem refuses it (never tried again), or `second` is gone."""
    if not _renameat2:
        import ctypes  # only in a supervisor whose output rotates

        renameat2 = getattr(libc(), "renameat2", None)
        if renameat2 is not None:
            renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
        _renameat2[:] = [renameat2]
    renameat2 = _renameat2[0]
    if renameat2 is None:
        return False
    if renameat2(folder_fd, os.fsencode(first), folder_fd, os.fsencode(second), RENAME_EXCHANGE) == 0:
        return True
    number = last_errno()
    if number in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        _renameat2[:] = [None]
    elif number != errno.ENOENT:  # gone (removed by hand): a rename puts the new one in its place
        raise OSError(number, os.strerror(number), second)
    return False


def _unlink(name: str, folder_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=folder_fd)
    except FileNotFoundError:
        pass


# -- the reader: serve's side of the rotation ----------------------------------------

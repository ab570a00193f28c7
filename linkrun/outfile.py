"""The capped output file of a background command, `background/<id>.out`.

The file always holds the bytes [kept_from, total) of the command's output.
When it reaches twice the cap, its newest `cap` bytes are copied into
`<id>.out.next`, the record learns the new file's inode and `kept_from`, and
the new file is renamed over the old (step 5, (a) to (e)): a reader that
finds an inode other than the record's loads the record again, and so never
reads at a stale offset. Opened relative to the folder's descriptor and never
through a link.
"""

from __future__ import annotations

import errno
import os

from .group import CHUNK
from .group import grow_pipe as grow_pipe  # where the supervisor's spawn looks for it
# Read and write: a rotation copies the newest bytes out of the old file.
OPEN_NEW = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
RETRY_FULL_DISK = 1.0


def open_background(files: str) -> int:
    """The files folder's `background/`, opened without following a link."""
    files_fd = os.open(files, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return os.open("background", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=files_fd)
    finally:
        os.close(files_fd)


class OutputFile:
    def __init__(self, folder_fd: int, name: str, fd: int, cap: int, on_rotate):
        self.folder_fd = folder_fd
        self.name = name
        self.fd = fd
        self.cap = cap
        self.on_rotate = on_rotate  # (inode, kept_from): writes the record, step (c)
        self.inode = os.fstat(fd).st_ino
        self.size = 0  # bytes in the current file
        self.kept_from = 0
        self.total = 0
        self.splice = True
        self.full_until = 0.0  # after a full disk: drop output until then
        self.buffer = None
        self.null = None

    @classmethod
    def create(cls, files: str, command_id: str, cap: int, on_rotate) -> OutputFile:
        folder_fd = open_background(files)
        name = f"{command_id}.out"
        try:
            fd = os.open(name, OPEN_NEW, 0o644, dir_fd=folder_fd)
        except BaseException:
            os.close(folder_fd)
            raise
        return cls(folder_fd, name, fd, cap, on_rotate)

    def pump(self, pipe_fd: int) -> int:
        """Move what the pipe holds into the file; the bytes moved, 0 at EOF."""
        import time

        if self.full_until and time.monotonic() < self.full_until:
            return self._drop(pipe_fd)
        try:
            if self.splice:
                try:
                    moved = os.splice(pipe_fd, self.fd, CHUNK)
                except OSError as error:
                    if error.errno != errno.EINVAL:
                        raise
                    self.splice = False  # this filesystem refuses splice: copy instead
                    return self.pump(pipe_fd)
            else:
                moved = self._copy(pipe_fd)
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # A full disk must never block the pipe (it would stall the program):
            # start an empty file (the dropped bytes end before its first
            # byte) and drop output for a second before trying again.
            self.full_until = time.monotonic() + RETRY_FULL_DISK
            try:
                self._restart(keep=0)
            except OSError:
                # Not even an empty file could be made: empty this one in place.
                os.ftruncate(self.fd, 0)
                os.lseek(self.fd, 0, os.SEEK_SET)
                self.size, self.kept_from = 0, self.total
                self.on_rotate(self.inode, self.kept_from)
            return self._drop(pipe_fd)
        if moved == 0:
            return 0
        self.total += moved
        self.size += moved
        if self.size >= 2 * self.cap:
            self._restart(keep=self.cap)
        return moved

    def _copy(self, pipe_fd: int) -> int:
        if self.buffer is None:
            self.buffer = bytearray(CHUNK)
        count = os.readv(pipe_fd, [self.buffer])
        view = memoryview(self.buffer)[:count]
        while view:
            view = view[os.write(self.fd, view):]
        return count

    def _drop(self, pipe_fd: int) -> int:
        if self.null is None:
            self.null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        moved = os.splice(pipe_fd, self.null, CHUNK)
        if moved == 0:
            return 0
        self.total += moved
        if self.size == 0:
            self.kept_from = self.total  # nothing kept: the file starts here
        return moved

    def _restart(self, keep: int):
        """Steps (a) to (e): a new file holding the newest `keep` bytes takes the old one's place."""
        keep = min(keep, self.size)
        next_name = self.name + ".next"
        new_fd = os.open(next_name, OPEN_NEW, 0o644, dir_fd=self.folder_fd)  # (a)
        try:
            offset = self.size - keep
            while keep - (copied := os.lseek(new_fd, 0, os.SEEK_CUR)) > 0:  # (b)
                done = os.copy_file_range(self.fd, new_fd, keep - copied, offset + copied)
                if done == 0:
                    break
            self.kept_from = self.total - keep
            inode = os.fstat(new_fd).st_ino
            self.on_rotate(inode, self.kept_from)  # (c)
            os.rename(next_name, self.name, src_dir_fd=self.folder_fd, dst_dir_fd=self.folder_fd)  # (d)
        except BaseException:
            os.close(new_fd)
            raise
        os.close(self.fd)  # (e)
        self.fd, self.inode, self.size = new_fd, inode, keep

    def finish(self):
        """At the end, cut once more: the last `cap` bytes are kept, never more."""
        if self.size > self.cap:
            self._restart(keep=self.cap)
        os.close(self.fd)
        os.close(self.folder_fd)
        if self.null is not None:
            os.close(self.null)


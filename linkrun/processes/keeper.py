"""One stream of a call, kept whole on disk past its answer's head and tail:
its last `cap` bytes, in a file of the state folder's `kept/`.

The file is a ring of `cap` bytes: byte n of the stream is written at n mod
cap, so a flood overwrites the same pages of the page cache and never makes
a gigabyte of dirty pages for the disk to write (appending to a file and
cutting it runs about five times slower here than a pipe into /dev/null;
the ring costs the copy into the page cache alone, about 0.05 s of CPU a
gigabyte). Once the capture's head is full the pipe is moved into the ring
(pump), and the capture's tail is read back from it at the end (last). At
the end a wrapped ring is copied once, in the kernel, into a plain file of
its last `cap` bytes: the reader sees what a background command's output
file holds, [kept_from, total).

The pump goes through a relay pipe of the keeper's own: the program's pipe
is spliced into it by reference, and the copy into the file is made from
the relay. A splice into a file holds its source pipe's lock for the whole
copy, so spliced straight from the program's pipe the program could not
write while serve copied (profiled: a quarter of the time spun on that
lock, 1.2× to 1.6× a call not kept); through the relay the two copy at
once, each on its own core.

Nothing is written while the stream fits in the capture (its head and tail
are then the whole stream): the file is made at the first byte the capture
would drop, from the capture's head and tail, so a call that prints little
costs nothing. No byte is ever held in serve's memory for it.

A failure of the disk (full, or a filesystem that refuses splice) never
fails the call: the stream is then not kept, and drained as it would be
without a keeper.
"""

from __future__ import annotations

import os

from .. import logger
from .group import CHUNK, grow_pipe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    class Captured(Protocol):
        """What a keeper reads of the capture it keeps beside (capture.Capture, which holds the keeper)."""

        head: bytearray
        tail: bytearray
        total: int

        @property
        def limit(self) -> int: ...

OPEN_NEW = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Keeper:
    """Writes one stream into `<name>` of `folder_fd` (which the caller owns and keeps open)."""

    __slots__ = ("folder_fd", "name", "cap", "fd", "written", "broken", "pumped", "stranded", "_null", "_relay")

    def __init__(self, folder_fd: int, name: str, cap: int) -> None:
        self.folder_fd, self.name, self.cap = folder_fd, name, cap
        self.fd: int | None = None
        self.written = 0  # bytes of the stream written (or skipped past) into the ring
        self.broken = False  # the disk failed it: nothing more is kept
        self.pumped = False  # bytes went into the ring by pump since the capture's tail was set
        self.stranded = b""  # bytes the pump took from the pipe and the disk refused (the capture takes them)
        self._null: int | None = None
        self._relay: tuple[int, int] | None = None  # (read end, write end), made at the first pump

    @property
    def active(self) -> bool:
        return self.fd is not None and not self.broken

    def open(self, capture: Captured) -> None:
        """The file, made now with all the capture holds (nothing was dropped yet)."""
        if self.fd is not None or self.broken:
            return
        try:
            self.fd = os.open(self.name, OPEN_NEW, 0o600, dir_fd=self.folder_fd)
        except OSError as error:
            self._fail(error)
            return
        self.write(bytes(capture.head + capture.tail))

    def take(self, capture: Captured, chunk: memoryview) -> None:
        """`chunk`, read from the pipe and about to be fed to the capture."""
        if self.fd is None and capture.total + len(chunk) > capture.limit:
            self.open(capture)
        if self.active:
            self.write(chunk)

    def write(self, data: bytes | memoryview) -> None:
        start = self.written
        self.written += len(data)
        if len(data) > self.cap:
            data = data[len(data) - self.cap:]
            start = self.written - self.cap
        try:
            while data:
                at = start % self.cap
                count = os.pwrite(self.fd, data[:self.cap - at], at)  # type: ignore[arg-type]  # active
                data, start = data[count:], start + count
        except OSError as error:
            self._fail(error)

    def pump(self, fd: int) -> int | None:
        """What the pipe `fd` holds, up to a chunk, moved into the ring through the relay: the bytes taken
        from the pipe (0 at its end), or None when nothing could be moved into the relay (nothing was taken).
        When the disk fails it, the bytes taken and not written are left in `stranded`."""
        try:
            if self._relay is None:
                self._relay = os.pipe2(os.O_CLOEXEC)
                grow_pipe(self._relay[1])  # else a relay of 64 KiB: more splices, the same bytes
            relay_r, relay_w = self._relay
            taken = os.splice(fd, relay_w, CHUNK)  # by reference: the program writes on meanwhile
        except OSError as error:
            self._fail(error)
            return None
        left = taken
        try:
            while left:
                at = self.written % self.cap
                moved = os.splice(relay_r, self.fd, min(left, self.cap - at), offset_dst=at)  # type: ignore[arg-type]
                if moved == 0:
                    raise OSError("the kept output took no byte")
                self.written += moved
                left -= moved
        except OSError as error:
            self._fail(error)
            self.stranded = _read_exactly(relay_r, left)
        self.pumped = True
        return taken

    def last(self, start: int) -> bytes:
        """The stream's bytes [start, written), read back from the ring (start within its last cap bytes)."""
        parts, at = [], start
        if self.fd is None:
            return b""  # finished already (a call that failed)
        try:
            while at < self.written:
                chunk = os.pread(self.fd, min(self.written - at, self.cap - at % self.cap), at % self.cap)
                if not chunk:
                    break
                parts.append(chunk)
                at += len(chunk)
        except OSError as error:
            self._fail(error)
        return b"".join(parts)

    def splice(self, fd: int, count: int) -> None:
        """Move exactly `count` bytes out of the pipe `fd`: into the ring, or, once broken, to /dev/null."""
        self.written += count
        start = self.written - count
        if count > self.cap:  # only its last cap bytes stay in the ring
            self._drain(fd, count - self.cap)
            start, count = self.written - self.cap, self.cap
        while count and self.active:
            at = start % self.cap
            try:
                moved = os.splice(fd, self.fd, min(count, self.cap - at), offset_dst=at)  # type: ignore[arg-type]
                if moved == 0:  # the tee said these bytes are in the pipe: never, but never loop on it
                    raise OSError("the pipe ended before the bytes it held")
            except OSError as error:
                self._fail(error)
                break
            start, count = start + moved, count - moved
        if count:
            self._drain(fd, count)

    def _drain(self, fd: int, count: int) -> None:
        if self._null is None:
            self._null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        while count:
            moved = os.splice(fd, self._null, count)
            if moved == 0:
                return
            count -= moved

    def _fail(self, error: OSError) -> None:
        logger.warning(f"a call's output is not kept past its answer: {error}")
        self.broken = True

    def finish(self, wanted: bool) -> tuple[int, int] | None:
        """Close the ring; when `wanted` and whole, the file holds the stream's
        last bytes in order: (kept_from, size). Otherwise it is removed: None."""
        fd, self.fd = self.fd, None
        self.pumped = False
        if self._null is not None:
            os.close(self._null)
            self._null = None
        if self._relay is not None:
            for end in self._relay:
                os.close(end)
            self._relay = None
        if fd is None:
            return None
        try:
            if wanted and not self.broken:
                return self._straighten(fd)
        except OSError as error:
            self._fail(error)
        finally:
            os.close(fd)
        self.remove()
        return None

    def _straighten(self, fd: int) -> tuple[int, int]:
        """A wrapped ring copied, in order, into a file that takes its place."""
        if self.written <= self.cap:
            return 0, self.written
        turn = self.written % self.cap
        if turn:
            straight = self.name + ".next"
            new = os.open(straight, OPEN_NEW, 0o600, dir_fd=self.folder_fd)
            try:
                for offset, length in ((turn, self.cap - turn), (0, turn)):
                    while length:
                        copied = os.copy_file_range(fd, new, length, offset)
                        if copied == 0:
                            raise OSError("the kept output ended early")
                        offset, length = offset + copied, length - copied
                os.rename(straight, self.name, src_dir_fd=self.folder_fd, dst_dir_fd=self.folder_fd)
            except BaseException:
                _unlink(straight, self.folder_fd)
                raise
            finally:
                os.close(new)
        return self.written - self.cap, self.cap

    def remove(self) -> None:
        _unlink(self.name, self.folder_fd)


def _read_exactly(fd: int, count: int) -> bytes:
    """The `count` bytes a pipe holds (there: nothing waits)."""
    parts = []
    while count:
        part = os.read(fd, count)
        if not part:
            break
        parts.append(part)
        count -= len(part)
    return b"".join(parts)


def _unlink(name: str, folder_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=folder_fd)
    except FileNotFoundError:
        pass

"""Head-and-tail capture of a stream, read from its pipe, and UTF-8 cuts that never split a character."""

from __future__ import annotations

import os

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..kernel import last_errno, libc
from .group import CHUNK, grow_pipe

if TYPE_CHECKING:
    from .keeper import Keeper


class Capture:
    """Keeps the first and last halves of `limit` bytes, and counts them all.
    Its tail holds one byte more than it shows, once full: the byte before
    the shown tail, which says whether that tail begins a line."""

    __slots__ = ("head", "tail", "total", "_head_room", "_tail_size")

    def __init__(self, limit: int):
        self._head_room = limit // 2
        self._tail_size = limit - limit // 2 + 1
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: memoryview) -> None:
        self.total += len(chunk)
        room = self._head_room - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._keep_tail(chunk)

    @property
    def head_full(self) -> bool:
        return len(self.head) >= self._head_room

    @property
    def limit(self) -> int:
        """What it holds whole: past it, bytes are left out."""
        return self._head_room + self._tail_size - 1

    @property
    def tail_size(self) -> int:
        return self._tail_size

    def count(self, count: int) -> None:
        """`count` bytes went by with the head full, kept elsewhere (a keeper's ring): the tail is set later."""
        self.total += count

    def set_tail(self, data: bytes) -> None:
        """The tail, from where the stream's last bytes are kept (the bytes after the head, at most tail-size)."""
        self.tail[:] = data

    def skip(self, count: int, last: bytes) -> None:
        """`count` bytes went by with the head full; `last` are their final bytes."""
        self.total += count
        self._keep_tail(last)

    def _keep_tail(self, data: bytes | memoryview) -> None:
        """The last tail-size bytes of what was kept so far followed by `data`."""
        if len(data) >= self._tail_size:
            self.tail[:] = data[len(data) - self._tail_size:]
        else:
            self.tail += data
            excess = len(self.tail) - self._tail_size
            if excess > 0:
                del self.tail[:excess]

    @property
    def left_out(self) -> int:
        """The bytes between head and tail; `texts` may leave out a line's piece more."""
        return self.total - len(self.head) - len(self._shown_tail())

    def _shown_tail(self) -> bytearray:
        return self.tail[1:] if len(self.tail) == self._tail_size else self.tail

    def texts(self) -> tuple[str, str, int]:
        """(head, tail) as text, and the bytes left out between them. A
        character cut at a boundary is dropped, not mangled; a tail that
        begins mid-line begins at its first whole line, where one starts in it."""
        tail = self._shown_tail()
        left_out = self.total - len(self.head) - len(tail)
        if left_out == 0:
            return decode(bytes(self.head + tail)), "", 0
        if len(tail) < len(self.tail) and self.tail[0] != 0x0A:  # the byte before it ends no line
            line = tail.find(b"\n", 0, len(tail) // 4) + 1  # a piece of at most a quarter of it
            if 0 < line < len(tail):
                tail, left_out = tail[line:], left_out + line
        return decode(utf8_head(self.head)), decode(utf8_tail(tail)), left_out


class CaptureReader:
    """Reads a pipe into its Capture; once the head is full, skims it.

    Called with the pipe when it is readable; returns the bytes it moved, 0
    at the end. `buffer` may be shared by the readers of one loop. With a
    keeper, the whole stream also goes to it (keeper.py), from the first
    byte the capture would leave out.
    """

    def __init__(self, capture: Capture, buffer: memoryview, keeper: Keeper | None = None) -> None:
        self.capture = capture
        self.buffer = buffer
        self.keeper = keeper
        self.skimmer: Skimmer | None = None  # made once, at the first read with the head full
        self.plain = False  # no tee here: copy as usual

    def __call__(self, fd: int) -> int:
        keeper = self.keeper
        if keeper is not None and self.capture.head_full:
            keeper.open(self.capture)  # the tail will roll: the file starts now
            if keeper.active and keeper.cap >= self.capture.limit:
                # Straight into the ring, no tee: the tail is read back from it at the end (close).
                moved = keeper.pump(fd)
                if moved is not None and not keeper.broken:
                    self.capture.count(moved)
                    return moved
                # It broke: on as without it, from the tail it holds and what it took and could not write.
                stranded, keeper.stranded = keeper.stranded, b""
                self.capture.count((moved or 0) - len(stranded))
                self._tail_from_keeper()
                if stranded:
                    self.capture.feed(memoryview(stranded))
                if moved is not None:
                    return moved
        if self.capture.head_full and not self.plain:
            try:
                if self.skimmer is None:
                    self.skimmer = Skimmer()
                return self.skimmer.skim(fd, self.capture, keeper)
            except OSError:
                self.plain = True  # tee, or the skimmer's pipes, failed before anything was read
        count = os.readv(fd, [self.buffer])
        if count:
            if self.keeper is not None:
                self.keeper.take(self.capture, self.buffer[:count])
            self.capture.feed(self.buffer[:count])
        return count

    def _tail_from_keeper(self) -> None:
        """The capture's tail read back from the keeper's ring, where the pump put the stream's last bytes."""
        keeper = self.keeper
        if keeper is not None and keeper.pumped:
            capture = self.capture
            # The pump runs only where the ring holds the whole limit, so the tail and the byte before it too
            # (but at --output 1, whose one byte is never cut for a line).
            capture.set_tail(keeper.last(max(len(capture.head), capture.total - capture.tail_size)))
            keeper.pumped = False

    def close(self) -> None:
        self._tail_from_keeper()
        if self.skimmer is not None:
            self.skimmer.close()
            self.skimmer = None


class Skimmer:
    """Drains a stream whose head is already kept, copying only its tail.

    A flood spends its time copying pages out of the pipe. Once the head is
    full only the last bytes matter, so each chunk is tee'd (by reference) to
    a side pipe, the stream's own copy spliced to /dev/null, and of the side
    copy only the last tail-size bytes are read: a gigabyte passes in about
    the time `cat` takes to copy it, or less.
    """

    _tee: Callable[..., int] | None = None  # libc's tee, loaded once

    def __init__(self) -> None:
        if Skimmer._tee is None:
            import ctypes

            tee = libc().tee
            tee.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint)
            tee.restype = ctypes.c_ssize_t
            Skimmer._tee = tee
        self.side_r, self.side_w = os.pipe2(os.O_CLOEXEC)
        try:
            grow_pipe(self.side_w)
            self.null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        except BaseException:
            os.close(self.side_r)
            os.close(self.side_w)
            raise

    def skim(self, fd: int, capture: Capture, keeper: Keeper | None = None) -> int:
        """One chunk; the stream's own copy goes to the keeper (to its file) when it is active."""
        assert Skimmer._tee is not None  # loaded by __init__
        count = Skimmer._tee(fd, self.side_w, CHUNK, 0)
        if count < 0:
            raise OSError(last_errno(), "tee")
        if count == 0:
            return 0
        if keeper is not None and keeper.active:
            keeper.splice(fd, count)
        else:
            os.splice(fd, self.null, count)
        keep = min(count, capture.tail_size)
        if count > keep:
            os.splice(self.side_r, self.null, count - keep)
        last = b""
        while len(last) < keep:
            last += os.read(self.side_r, keep - len(last))
        capture.skip(count, last)
        return count

    def close(self) -> None:
        for fd in (self.side_r, self.side_w, self.null):
            os.close(fd)


def decode(data: bytes | bytearray) -> str:
    return bytes(data).decode("utf-8", errors="replace")


def utf8_head(data: bytes | bytearray) -> bytes:
    """`data` without a UTF-8 character cut off at its end."""
    end = len(data)
    # Walk back over at most 3 continuation bytes to the lead byte.
    index = end - 1
    while index >= 0 and end - index <= 3 and 0x80 <= data[index] < 0xC0:
        index -= 1
    if index >= 0:
        lead = data[index]
        need = 2 if 0xC0 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else 4 if 0xF0 <= lead < 0xF8 else 1
        if need > end - index:
            return bytes(data[:index])
    return bytes(data)


def utf8_tail(data: bytes | bytearray) -> bytes:
    """`data` without the continuation bytes of a character cut at its start."""
    start = 0
    while start < len(data) and start < 3 and 0x80 <= data[start] < 0xC0:
        start += 1
    return bytes(data[start:])

"""Reading a background command's output file, `background/<id>.out`, by its
record: where its bytes lie, and a read that is never at a stale offset.

The writer (outfile.py) rotates the file under a reader: the record names the
current file and the one before it (`inode`, `kept_from`, `prev_inode`,
`prev_kept_from`), and a reader that finds an inode the record does not name
loads the record again and looks once more (`looked_at`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from ..state import layout, records
from ..processes.capture import utf8_head, utf8_tail
from ..errors import LinkRunError, Refused

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..state.records import Record, Shown

LOOK_PATIENCE = 2.0  # seconds a read looks again while rotations come between its two looks

def open_background(files: str) -> int:
    """The files folder's `background/`, opened without following a link."""
    files_fd = os.open(files, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return os.open(layout.BACKGROUND, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=files_fd)
    finally:
        os.close(files_fd)


def kept_from_of(record: Record, inode: int) -> int | None:
    """Where the output file with this inode starts, by the record; None when
    the record names other files (a rotation came between the two looks)."""
    if record.get("inode") in (None, inode):
        return record.get("kept_from") or 0
    if record.get("prev_inode") == inode:
        return record.get("prev_kept_from") or 0
    return None


def last_bytes(record: Record) -> bytes:
    """The end of the command's output for the told message (the record's `output` // 2 bytes)."""
    fd = _output_of(record)
    if fd is None:
        return b""
    want = max(0, int(record.get("output") or 0) // 2)
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, min(want, size), max(0, size - want))
    finally:
        os.close(fd)


def open_output(folder_fd: int, command_id: str) -> int | None:
    """`<id>.out` for reading, never through a link (ELOOP); None when there is none."""
    try:
        return os.open(layout.output_name(command_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd)
    except FileNotFoundError:
        return None


def measure(record: Record) -> tuple[int, int, int] | None:
    """(inode, kept_from, size) of a command's output file as its record
    names it, or None; for a record no supervisor writes any more."""
    fd = _output_of(record)
    if fd is None:
        return None
    try:
        return _placed(fd, record)
    finally:
        os.close(fd)


def _output_of(record: Record) -> int | None:
    """A command's output file for reading, by its record; None when there is none, or it is a link."""
    try:
        folder = open_background(record["files"])
    except OSError:
        return None
    try:
        return open_output(folder, record["id"])
    except OSError:  # a link (ELOOP): never followed
        return None
    finally:
        os.close(folder)


class Removed(Exception):
    """The command's record went away under the read."""


@dataclass(frozen=True)
class ReadChunk:
    """What one read found: bytes [offset, next) of the output, of `total` so far."""

    record: Shown
    data: bytes
    offset: int
    kept_from: int  # where the kept bytes start
    total: int
    ended: bool  # the command ended: no more output comes

    @property
    def next(self) -> int:
        return self.offset + len(self.data)


class Look(NamedTuple):
    fd: int | None  # the output file, open; None when there is none
    size: int
    record: Shown
    kept_from: int  # where this file starts in the output


def read_once(folder_fd: int, state: str, command_id: str, offset: int | None, limit: int) -> ReadChunk:
    """One consistent look at the output file and its record: at most `limit`
    bytes from `offset`, or without it the last `limit` bytes (from a line's start, where one begins in them)."""
    with looked_at(folder_fd, state, command_id) as look:
        if look.fd is None:
            return ReadChunk(look.record, b"", 0, 0, 0, look.record["state"] not in records.RUNNING_STATES)
        return read_at(look, offset, limit)


def output_total(folder_fd: int, state: str, command_id: str) -> int | None:
    """The output's total by its file and a record that names that file."""
    with looked_at(folder_fd, state, command_id) as look:
        return None if look.fd is None else look.kept_from + look.size


@contextlib.contextmanager
def looked_at(folder_fd: int, state: str, command_id: str) -> Iterator[Look]:
    """The output file, open, with a record that names it (as the current
    file or the one before): so the bytes are read at their own offsets.

    Looks again while a rotation runs between the two looks (two rotations
    in between, or a record write held up by a slow disk), for up to
    LOOK_PATIENCE seconds.
    """
    deadline, pause = time.monotonic() + LOOK_PATIENCE, 0.001
    while (look := _look(folder_fd, state, command_id)) is None:
        if time.monotonic() > deadline:
            raise LinkRunError(f"the output of {command_id} kept changing under the read", "read again")
        time.sleep(pause)
        pause = min(2 * pause, 0.05)
    try:
        yield look
    finally:
        if look.fd is not None:
            os.close(look.fd)


def _look(folder_fd: int, state: str, command_id: str) -> Look | None:
    """The file, then the record: the look, or None when they do not match."""
    try:
        fd = open_output(folder_fd, command_id)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise Refused(f"{layout.shown_output(command_id)} is a link, which is never followed",
                          "the output is not readable") from None
        raise
    try:
        record = records.load(state, command_id)
        if record is None:
            raise Removed(command_id)
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    return _match(fd, record)


def _match(fd: int | None, record: Record) -> Look | None:
    """The look, or None (the descriptor closed) when the record names other files."""
    if fd is None:  # none yet, or removed by hand (a rotation renames over it, never removes it)
        return Look(None, 0, record, 0)
    placed = _placed(fd, record)
    if placed is None:
        os.close(fd)
        return None
    _, kept_from, size = placed
    return Look(fd, size, record, kept_from)


def _placed(fd: int, record: Record) -> tuple[int, int, int] | None:
    """(inode, kept_from, size) of the open output file, or None when the record names other files."""
    info = os.fstat(fd)
    kept_from = kept_from_of(record, info.st_ino)
    return None if kept_from is None else (info.st_ino, kept_from, info.st_size)


def read_at(look: Look, offset: int | None, limit: int) -> ReadChunk:
    record, kept_from = look.record, look.kept_from
    total = kept_from + look.size
    ended = record["state"] not in records.RUNNING_STATES
    start = max(kept_from, total - limit) if offset is None else min(max(offset, kept_from), total)
    assert look.fd is not None  # read_once answers a look without a file itself
    data = os.pread(look.fd, min(limit, total - start), start - kept_from) if start < total else b""
    if offset is None and start > kept_from and os.pread(look.fd, 1, start - kept_from - 1) != b"\n":
        line = data.find(b"\n") + 1  # its last bytes begin mid-line: from the next line, where one begins in them
        if 0 < line < len(data):
            start, data = start + line, data[line:]
    if start > kept_from or offset is None or offset < kept_from:
        trimmed = utf8_tail(data)  # never start inside a character
        start += len(data) - len(trimmed)
        data = trimmed
    if start + len(data) < total or not ended:
        data = utf8_head(data)  # a character still being written waits for the next read
    return ReadChunk(record, data, start, kept_from, total, ended)

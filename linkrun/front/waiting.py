"""`read` with `wait` and `pattern`: a background command's output followed
as it grows, fed to one `lines.Scanner` from the offset on, until a line
matches, the command ends, or the wait does.

It waits as a `read` with `wait` does: on serve's one Watcher (inotify,
through watchdog), woken by a change to the command's files, so a wait uses
no CPU between writes. Every wake feeds the scanner what the file holds past
what it was fed, so a line written in two pieces is matched once its newline
comes; a last line without a newline is matched when the command ends, or
while it waits for input: a prompt. A last line that matches is looked at
every PROMPT_LOOK seconds until one of those, or its newline, comes.

The output file is held open across rotations: a rotation renames a new
file over it, and the old one, whose bytes are final once the new one is in
place, is read to its end before the new one is taken up. Only bytes that two
rotations cut away before a wake could read them are lost; the answer counts
them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..detached import outread
from ..detached.input import waiting_for_input
from ..state import records
from ..detached.lines import BLOCK, SCAN_SECONDS, SCREEN, Found, Line, Scanner, line_at
from ..errors import Refused

if TYPE_CHECKING:
    from ..state.records import Shown
    from ..detached.background import Background

MAX_WAIT = 30  # a read's longest wait, of a background command's output or a kept one's


def wait_seconds(arguments: dict[str, Any]) -> float:
    """A read's `wait` argument, checked once for every read: 0 when left out."""
    wait = arguments.get("wait", 0)
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= MAX_WAIT:
        raise Refused(f"wait must be a number of seconds from 0 to {MAX_WAIT}")
    return float(wait)

MATCH, END, TIME = "match", "end", "time"  # why a wait on a line returned
PROMPT_LOOK = 0.05  # seconds between looks at a command whose last line, not ended yet, matches
PROGRESS_EVERY = 0.25


@dataclass
class Waited:
    """What a wait on a line found: the lines (at most a screenful), why it returned, after how long."""

    record: Shown
    found: Found
    until: str  # MATCH, END or TIME
    seconds: float
    kept_from: int
    total: int
    lost: int = 0  # bytes rotated away before they could be searched
    prompt: bool = False  # the line matched is a prompt: its last, not ended, while the command waits for input


class _Follower:
    """The output file, open, followed across rotations (see the module's docstring)."""

    def __init__(self, folder: int, state: str, command_id: str) -> None:
        self.folder, self.state, self.id = folder, state, command_id
        self.fd: int | None = None
        self.inode = self.kept_from = 0
        self.pending: tuple[int, int, int] | None = None  # (fd, inode, kept_from) of the file that replaced ours

    def refresh(self) -> Shown:
        """The record, and the file it names taken up (or kept pending while ours is read to its end)."""
        with outread.looked_at(self.folder, self.state, self.id) as look:
            if look.fd is None:
                return look.record
            inode = os.fstat(look.fd).st_ino
            if self.fd is None:
                self.fd, self.inode, self.kept_from = os.dup(look.fd), inode, look.kept_from
            elif inode != self.inode and (self.pending is None or self.pending[1] != inode):
                if self.pending is not None:
                    os.close(self.pending[0])  # two rotations since: the one between is lost
                self.pending = (os.dup(look.fd), inode, look.kept_from)
            return look.record

    def take_pending(self) -> bool:
        """Ours read to its end: the file that replaced it is ours now."""
        if self.pending is None:
            return False
        assert self.fd is not None  # a pending file replaces one we hold
        os.close(self.fd)
        self.fd, self.inode, self.kept_from = self.pending
        self.pending = None
        return True

    def size(self) -> int:
        return 0 if self.fd is None else os.fstat(self.fd).st_size

    def close(self) -> None:
        for fd in (self.fd, self.pending[0] if self.pending else None):
            if fd is not None:
                os.close(fd)
        self.fd, self.pending = None, None


class _Search:
    """One scanner fed from the follower, the lines it found gathered as a screenful."""

    def __init__(self, pattern: Any, follower: _Follower, offset: int | None) -> None:
        assert follower.fd is not None  # made once there is a file
        self.pattern, self.follower = pattern, follower
        kept_from = follower.kept_from
        total = kept_from + follower.size()
        start = kept_from if offset is None else min(max(offset, kept_from), total)
        line_start, number = line_at(follower.fd, kept_from, start)
        self.scanner = Scanner(pattern, 1, None, number, line_start)
        self.found = Found(start=line_start, to=line_start, next=line_start)
        self.lost = 0

    def drain(self, deadline: float, final: bool) -> None:
        """Feed what the file holds past what was fed (the file that replaced it too), until a line is
        found or `deadline`; with `final` (the command ended, its file read whole), the last line too."""
        follower, scanner = self.follower, self.scanner
        while not self.found.lines and time.monotonic() < deadline:
            at = scanner.offset + len(scanner.carry)
            assert follower.fd is not None  # a search is made once there is a file
            data = os.pread(follower.fd, BLOCK, at - follower.kept_from) if at >= follower.kept_from else b""
            if data:
                self._take(scanner.feed(data))
            elif follower.take_pending():
                if follower.kept_from > at:  # cut away before we read it: go on where the kept bytes start
                    self.lost += follower.kept_from - at
                    self.scanner = scanner = Scanner(self.pattern, 1, None, 1, follower.kept_from)
            else:
                if final:
                    self._take(scanner.feed(b"", final=True))
                break
        self.found.to = scanner.offset

    def take_prompt(self, lines: list[Line]) -> None:
        """The last line, not ended yet (`Scanner.unfinished`), taken as found: the caller saw the command
        wait for input with nothing more to read."""
        self._take(lines)
        self.found.next = lines[-1].offset + lines[-1].length  # its end: the next wait goes on from there

    def _take(self, lines: Any) -> None:
        for line in lines:
            if len(self.found.lines) < SCREEN:
                self.found.lines.append(line)
                self.found.next = line.offset + line.length + 1
            else:
                self.found.more += 1


def wait_for_line(background: Background, record: Shown, pattern: Any, offset: int | None, wait: float,
                  progress: Callable[[float, float], None] | None) -> Waited:
    """Lines matching `pattern` from `offset` (its line; none: the first kept), as soon as one is there,
    or the command's end, or `wait` seconds. The caller checked that the record is the conversation's."""
    command_id = record["id"]
    started = time.monotonic()
    deadline = started + wait
    reported: float | None = None
    watcher = background.watcher
    with watcher.watching(True), background.output_folder() as folder:
        follower = _Follower(folder, background.state, command_id)
        search: _Search | None = None
        try:
            while True:
                seen = watcher.changes(command_id)
                try:
                    record = follower.refresh()
                except outread.Removed:
                    from ..detached.background import UNKNOWN

                    raise Refused(UNKNOWN.format(id=command_id)) from None
                ended = record["state"] not in records.RUNNING_STATES
                if search is None and follower.fd is not None:
                    search = _Search(pattern, follower, offset)
                if search is not None:
                    # A long output already there is searched for SCAN_SECONDS at least, as a read without wait.
                    search.drain(max(deadline, started + SCAN_SECONDS), final=ended)
                # A last line not ended yet that matches: a prompt, once the command waits for input.
                candidate = search.scanner.unfinished() if search is not None and not search.found.lines \
                    and not ended else []
                prompt = bool(candidate) and waiting_for_input(background.state, record)
                if prompt:
                    assert search is not None  # a candidate comes from a search
                    search.take_prompt(candidate)
                now = time.monotonic()
                until = MATCH if search is not None and search.found.lines else END if ended else \
                    TIME if now >= deadline else None
                if until is not None:
                    answer = _waited(record, search, follower, until, now - started)
                    answer.prompt = prompt
                    return answer
                waited = round(now - started, 1)
                if progress is not None and (reported is None or waited >= reported + PROGRESS_EVERY):
                    progress(waited, wait)
                    reported = waited
                watcher.wait_change(command_id, seen, min(PROMPT_LOOK if candidate else 1.0, deadline - now))
        finally:
            follower.close()


def _waited(record: Shown, search: _Search | None, follower: _Follower, until: str, seconds: float) -> Waited:
    kept_from = follower.kept_from
    total = kept_from + follower.size()
    if search is None:
        return Waited(record, Found(start=0, to=0, next=0), until, seconds, kept_from, total)
    found = search.found
    if not found.lines:
        found.next = found.to  # the start of a line not ended yet: the next wait goes on from there
    found.next = min(found.next, total)
    return Waited(record, found, until, seconds, kept_from, total, search.lost)

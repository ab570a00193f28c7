"""The lines a supervisor's `tell_on` pattern matches, found on a thread of
their own as the pump writes the output file.

The pump splices the program's output into the file and never sees it. This
thread reads what the pump wrote (from the page cache) and feeds it to a
`lines.LineFinder`. RE2 and pread release the GIL, so the search runs on
another core beside the pump: measured, the pump keeps its speed (see
docs/decisions.md "Told when a line appears").

It holds each output file open until it has read it to its end: a rotation
puts a new file in the old one's place, and the old one's bytes stay
readable through this descriptor, so no line is lost to a rotation however
small the cap. The pump waits when the thread holds MAX_FILES files (it
has fallen more than that many rotations behind), so the disk held by files
already rotated away stays bounded, as does memory (LineFinder keeps one
line of at most a block).

Threads: `moved`, `new_file` and `finish` are called by the pump's (main)
thread; `take` by the main thread too. The lines found are only handed
over: every record write stays on the main thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from .lines import BLOCK, LineFinder

MAX_FILES = 3  # held open at once: the current one and two rotated away
MAX_HELD = 1000  # lines found and not yet taken, kept; the rest counted
LAZY = 0.05  # seconds the thread waits at most before it looks for fewer bytes than a block


class LineScan:
    """The output followed as the pump writes it; `wake()` is called (from the
    thread) when lines were found, which `take()` then returns."""

    def __init__(self, finder: LineFinder, wake: Callable[[], None], log: Callable[[str], None]) -> None:
        self.finder = finder
        self.wake, self.log = wake, log
        self.condition = threading.Condition()
        self.files: list[tuple[int, int]] = []  # (fd, kept_from), oldest first: the thread reads the first
        self.written = 0  # a count the pump bumps: a change means a block or more is there
        self.unread = 0  # bytes written since the last bump
        self.ended = False
        self.failed = False  # the thread stopped on an error: no file is held for it any more
        self.found: list[tuple[int, bytes]] = []
        self.more = 0  # lines found past MAX_HELD not yet taken: counted, not kept
        self.lost = 0  # bytes the thread could not read (the disk was full: never written)
        self.thread = threading.Thread(target=self._run, name="lines", daemon=True)

    # -- the pump's side (main thread) --------------------------------------

    def new_file(self, fd: int, kept_from: int) -> None:
        """A new output file, from its creation or a rotation's (e): held open (a dup) until read."""
        with self.condition:
            # Bounded: the pump waits while the thread reads the files before.
            self.condition.wait_for(lambda: len(self.files) < MAX_FILES or self.failed)
            if self.failed:
                return  # the search stopped (logged): the pump goes on without it
            self.files.append((os.dup(fd), kept_from))
            self.condition.notify_all()
        if not self.thread.is_alive() and not self.ended:
            self.thread.start()

    def moved(self, count: int) -> None:
        """The pump wrote `count` bytes more. The thread is woken once a block is waiting, else it looks
        every LAZY seconds: woken for each write, it would take the GIL from the pump as often."""
        self.unread += count  # the pump's thread alone writes it
        if self.unread >= BLOCK:
            self.unread = 0
            with self.condition:
                self.written += 1
                self.condition.notify_all()

    def finish(self) -> None:
        """The output ended: the thread reads what is left, the last line too, and exits."""
        with self.condition:
            self.ended = True
            self.condition.notify_all()
        if self.thread.is_alive():
            self.thread.join()
        for fd, _ in self.files:
            os.close(fd)
        self.files.clear()

    def take(self) -> tuple[list[tuple[int, bytes]], int]:
        """The lines found since the last take, (offset, at most LINE_SHOWN bytes) each, and how many
        more were found past MAX_HELD (counted only)."""
        with self.condition:
            found, more, self.found, self.more = self.found, self.more, [], 0
        return found, more

    # -- the thread -----------------------------------------------------------

    def _run(self) -> None:
        try:
            self._follow()
        except Exception as problem:  # noqa: BLE001 - the pump goes on; only the telling of lines stops
            self.log(f"cannot look for tell_on lines any more: {problem!r}")
            with self.condition:
                self.failed = True
                for fd, _ in self.files:
                    os.close(fd)
                self.files.clear()
                self.condition.notify_all()

    def _follow(self) -> None:
        at = 0  # the offset of the next byte to read
        while True:
            with self.condition:
                seen = self.written
                fd, kept_from = self.files[0]
                later = len(self.files) > 1
                ended = self.ended
            if at < kept_from:  # never written (a full disk dropped it): go on where the file starts
                self.lost += kept_from - at
                self._hand(self.finder.feed(b"", final=True))
                self.finder = self.finder.at(kept_from)
                at = kept_from
            data = os.pread(fd, BLOCK, at - kept_from)
            if data:
                at += len(data)
                self._hand(self.finder.feed(data))
                continue
            if later:  # read to its end, and final since a new one took its place
                with self.condition:
                    os.close(self.files.pop(0)[0])
                    self.condition.notify_all()
                continue
            if ended:
                self._hand(self.finder.feed(b"", final=True))
                return
            self._wait_past(seen)

    def _wait_past(self, seen: int) -> None:
        """Until the pump wrote a block more, a new file came, the output ended, or LAZY seconds."""
        with self.condition:
            self.condition.wait_for(lambda: self.written != seen or len(self.files) > 1 or self.ended, LAZY)

    def _hand(self, lines: list[tuple[int, bytes]]) -> None:
        if lines:
            with self.condition:
                room = max(0, MAX_HELD - len(self.found))
                self.found.extend(lines[:room])
                self.more += len(lines) - min(room, len(lines))
            self.wake()

"""Lines of an output: a pattern checked and compiled for linear-time
matching, and a scan of an output file for the lines a range and a pattern
select, with their numbers and byte offsets.

Patterns are RE2's (google-re2): matching takes time linear in the text
whatever the pattern, so no pattern can hang the server or a supervisor
(Python's `re` backtracks: `(a+)+b` on a line of a's runs for ever). A
pattern RE2 cannot take (a backreference, a lookaround, a repetition past
1000, more memory than MAX_PATTERN_MEMORY) is refused, saying why. A match
never crosses a newline (`never_nl`): each match is within one line.

The scan reads the file in blocks of BLOCK bytes and never holds more: a
line longer than a block is matched and numbered as pieces of a block. It
stops at a deadline, saying where, so a slow disk or a huge file cannot
hold a call either. It is fed from one Look (outfile.py), so the bytes are
read at their own offsets while a running command's output rotates.

The scan is written to be fed chunks in order (Scanner.feed), so that a
watch on a running command's new bytes can use the same matching.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import Refused
from ..state.records import LINE_SHOWN

BLOCK = 1 << 20
MAX_PATTERN = 1000  # characters
MAX_PATTERN_MEMORY = 8 << 20  # RE2's budget for one compiled pattern
SCAN_SECONDS = 2.0  # a scan stops here, and says where
SCREEN = 50  # lines shown at most
MISSES = 16  # lines of a block holding a literal and no match, before tell_on's search goes on by RE2 alone
_RANGE = re.compile(r"(\d+)(?:-(\d*))?|-(\d+)")  # matched whole: "120-180", "120-", "120", "-50"
PATTERN_HINT = ("write it in RE2 syntax (as Python's re, without backreferences and lookarounds), "
                "such as error|warning or ^FAIL")


def compile_pattern(pattern: object, whole_lines: bool = True) -> Any:
    """The pattern, compiled for bytes; Refused, saying why, when RE2 cannot take it.

    `whole_lines`: a match is the whole line it is in (for Scanner); else it is
    the pattern's own match, with `^` and `$` at each line's ends (for LineFinder)."""
    if not isinstance(pattern, str) or not pattern:
        raise Refused("pattern must be a non-empty text", PATTERN_HINT)
    if len(pattern) > MAX_PATTERN:
        raise Refused(f"pattern is {len(pattern)} characters long, past {MAX_PATTERN}", "give a shorter one")
    import re2  # google-re2: loaded only by a read with a pattern

    options = re2.Options()
    options.never_nl = True  # a match is within a line
    options.log_errors = False  # the refusal says it; serve's log need not
    options.max_mem = MAX_PATTERN_MEMORY
    try:
        re2.compile(pattern.encode(), options)  # whole by itself, so that the wrapping below cannot change it
        # ^ and $ at each line's start and end; a match is the whole line it is in, so that a line is found
        # once, and the lines of a block are counted by findall in C.
        if not whole_lines:
            return re2.compile(b"(?m)" + pattern.encode(), options)
        return re2.compile(b"(?m)^.*(?:" + pattern.encode() + b").*$", options)
    except re2.error as error:
        why = error.args[0].decode(errors="replace") if error.args and isinstance(error.args[0], bytes) else str(error)
        from ..messages.told import shown_word  # a pattern as it was given: repr would double each backslash

        raise Refused(f"pattern {shown_word(pattern)} cannot be taken: {why}", PATTERN_HINT) from None


@dataclass(frozen=True)
class LineRange:
    """Lines `first` to `last` (1-based, inclusive; None: to the end), or the `tail` last ones."""

    first: int = 1
    last: int | None = None
    tail: int | None = None


def parse_range(text: object) -> LineRange:
    """`120-180`, `120-` (to the end), `120` (one line), `-50` (the last 50)."""
    match = _RANGE.fullmatch(text) if isinstance(text, str) else None
    hint = 'write 120-180 (lines 120 to 180), 120- (from line 120), 120 (one line) or -50 (the last 50)'
    if match is None:
        raise Refused(f"lines {text!r} is not a range of lines", hint)
    if match.group(3) is not None:
        tail = int(match.group(3))
        if tail == 0:
            raise Refused("lines -0 asks for no line", hint)
        return LineRange(tail=tail)
    first = int(match.group(1))
    last = first if match.group(2) is None else int(match.group(2)) if match.group(2) else None
    if first == 0 or (last is not None and last < first):
        raise Refused(f"lines {text!r} is not a range of lines: lines count from 1, the first before the last", hint)
    return LineRange(first, last)


@dataclass(frozen=True)
class Line:
    number: int  # counted from the first line of the kept output (1)
    offset: int  # its first byte, counted from the output's first byte
    data: bytes  # at most LINE_SHOWN bytes of it, without its newline
    length: int  # its whole length


@dataclass
class Found:
    """What a scan found: at most SCREEN lines, and how many more matched."""

    lines: list[Line] = field(default_factory=list)
    more: int = 0  # lines that matched past the shown ones (up to `to`)
    start: int = 0  # the byte the scan started at
    to: int = 0  # the byte it stopped at: the end, or where the deadline cut it
    ended: bool = True  # False: the deadline cut it at `to`
    next: int = 0  # where to go on after the shown lines (with offset)


class Scanner:
    """Fed the bytes of an output in order, from the start of a line: each
    line (or piece of a longer one) the range and the pattern select, with
    its number and offset. `number` is the number of the line `feed` starts at."""

    def __init__(self, pattern: Any, first: int, last: int | None, number: int, offset: int) -> None:
        self.pattern, self.first, self.last = pattern, first, last
        self.number, self.offset = number, offset  # of the next byte fed
        self.carry = b""  # a line not ended yet
        # Once set, the selected lines are counted into `counted`, not yielded (matched in C where a block
        # lies wholly within the range).
        self.counting = False
        self.counted = 0

    def feed(self, data: bytes, final: bool = False) -> Iterator[Line]:
        """The selected lines ending in `data` (all of them when `final`: no more bytes come)."""
        block = self.carry + data
        end = block.rfind(b"\n") + 1
        if final:
            end = len(block)
        elif end == 0 and len(block) >= BLOCK:
            end = len(block)  # a line longer than a block: matched as a piece
        self.carry = block[end:]
        if self.counting:
            self.counted += self._count(block, end)
        else:
            yield from self._lines(block, end)
        self.offset += end
        self.number += block.count(b"\n", 0, end) + (1 if end and block[end - 1] != 0x0A else 0)

    def unfinished(self) -> list[Line]:
        """The line not ended yet, if the range and the pattern select it, as a final `feed` would give
        it: a prompt, which ends with no newline. Nothing is consumed: more of the line may come."""
        if not self.carry or self.counting:
            return []
        return list(self._lines(self.carry, len(self.carry)))

    def _count(self, block: bytes, end: int) -> int:
        if end == 0:
            return 0  # no line: an empty match here would be one that is not there
        newlines = block.count(b"\n", 0, end)
        within = self.number >= self.first and (self.last is None or self.number + newlines <= self.last)
        if self.pattern is not None and within:
            # Up to the last newline, not past it: past it an empty match would be a line that is not there.
            return len(self.pattern.findall(block, 0, end - 1 if end and block[end - 1] == 0x0A else end))
        return sum(1 for _ in self._lines(block, end))

    def _lines(self, block: bytes, end: int) -> Iterator[Line]:
        number, counted, at = self.number, 0, 0
        if number + block.count(b"\n", 0, end) < self.first:
            return  # the range starts past this block
        while at < end:
            if self.pattern is not None:
                found = self.pattern.search(block, at, end)
                if found is None or found.start() >= end:  # none, or an empty line past the last
                    return
                start = max(at, block.rfind(b"\n", at, found.start()) + 1)
            else:
                start = at
            number += block.count(b"\n", counted, start)
            counted = start
            if self.last is not None and number > self.last:
                return
            stop = block.find(b"\n", start, end)
            stop = end if stop < 0 else stop
            if number >= self.first:
                yield Line(number, self.offset + start, block[start:min(stop, start + LINE_SHOWN)], stop - start)
            at = stop + 1


class LineFinder:
    """The complete lines matching a pattern (compiled with whole_lines=False)
    in bytes fed in order, each with its offset: for a supervisor's pump,
    which must keep its speed.

    The pattern's own match is searched for, not a whole-line one: RE2 then
    skips to a literal in C (about 100 GB/s on lines that cannot match, where
    `^.*(?:…).*$` runs at 0.5), and only a line holding a match costs Python
    work. A pattern whose every match starts a line is found by RE2
    skipping from newline to newline instead (_line_starts), whatever its
    literals. Chunks are searched where they lie, never joined: only the line
    that a chunk's start cuts is joined with what came before. Memory is
    bounded: a line not ended yet is kept up to BLOCK bytes, then matched as
    a piece, as Scanner does."""

    def __init__(self, pattern: Any, offset: int = 0, literals: list[bytes] | None = None,
                 line_starts: bool = False) -> None:
        import re2

        self.pattern = pattern
        self.literals = literals  # one of them is in each matching line (literals.py), or None: unknown
        self.line_starts = line_starts  # each match starts a line (literals.starts_lines)
        self.finders: list[Any] = []  # each literal as a pattern of its own: RE2 skips to it with memchr
        self.starts: Any = None  # without literals: a newline then the pattern, which RE2 skips to with memchr
        options = re2.Options()
        options.log_errors = False
        if literals is not None:
            self.finders = [re2.compile(re2.escape(literal), options) for literal in literals]
        elif line_starts:
            options.max_mem = MAX_PATTERN_MEMORY
            try:  # not never_nl: it matches the newline before the line (a match may run on: it is only a start)
                self.starts = re2.compile(b"(?m)\n(?:" + pattern.pattern + b")", options)
            except re2.error:
                pass  # RE2 alone, which is always right
        self.offset = offset  # of the next byte fed
        self.carry = b""  # a line not ended yet

    def at(self, offset: int) -> LineFinder:
        """A finder of the same lines, fed from `offset` on."""
        return LineFinder(self.pattern, offset, self.literals, self.line_starts)

    def feed(self, data: bytes, final: bool = False) -> list[tuple[int, bytes]]:
        """(offset, at most LINE_SHOWN bytes) of each matching line ending in `data`; with `final`, the last too."""
        found: list[tuple[int, bytes]] = []
        base, at = self.offset, 0  # the offset of data[0]; where data's own lines start
        self.offset += len(data)
        if self.carry:
            newline = data.find(b"\n")
            if newline < 0 and not final:
                self.carry += data
                if len(self.carry) >= BLOCK:  # a line longer than a block: matched as a piece
                    self._search(self.carry, len(self.carry), self.offset - len(self.carry), found)
                    self.carry = b""
                return found
            at = len(data) if newline < 0 else newline + 1
            joined = self.carry + data[:at]
            self._search(joined, len(joined), base - len(self.carry), found)
            self.carry = b""
        end = len(data) if final else max(at, data.rfind(b"\n", at) + 1)
        if end > at:
            self._search(data, end, base, found, at)
        self.carry = data[end:]
        if len(self.carry) >= BLOCK:
            self._search(self.carry, len(self.carry), base + end, found)
            self.carry = b""
        return found

    def _search(self, block: bytes, end: int, base: int, found: list[tuple[int, bytes]], at: int = 0) -> None:
        """The matching lines of block[at:end], whole lines; `base` is the offset of block[0]."""
        if self.starts is not None:
            _line_starts(self, block, end, base, found, at)
        elif self.literals is not None:
            _prefiltered(self, block, end, base, found, at)
        else:
            _plain(self, block, end, base, found, at)


def _plain(finder: LineFinder, block: bytes, end: int, base: int, found: list[tuple[int, bytes]], at: int) -> None:
    """LineFinder._search by RE2 alone: about 0.8 GB/s where the pattern holds no literal to skip to."""
    while at < end:
        match = finder.pattern.search(block, at, end)
        if match is None:
            return
        where = match.start()
        if where > end or (where == end and block[end - 1] == 0x0A):
            return  # an empty match past the last newline: no line is there
        start = max(at, block.rfind(b"\n", at, where) + 1)
        stop = block.find(b"\n", where, end)
        stop = end if stop < 0 else stop
        found.append((base + start, block[start:min(stop, start + LINE_SHOWN)]))
        at = stop + 1


def scan(fd: int, kept_from: int, size: int, pattern: Any, lines: LineRange, offset: int | None,
         deadline: float | None = None) -> Found:
    """The lines of the file `fd` (bytes [kept_from, kept_from + size) of the output) that `lines` and
    `pattern` select, from `offset` (its line; none: the start), as a Found."""
    deadline = deadline if deadline is not None else time.monotonic() + SCAN_SECONDS
    total = kept_from + size
    start = kept_from if offset is None else min(max(offset, kept_from), total)
    first, last = lines.first, lines.last
    if lines.tail is not None:
        count = _count_lines(fd, 0, size)
        first, last = max(1, count - lines.tail + 1), None
    # The line `start` falls in, and its number: newlines counted from the kept output's start.
    line_start, number = line_at(fd, kept_from, start)
    scanner = Scanner(pattern, first, last, number, line_start)
    found = Found(start=line_start, to=total, next=total)
    at = line_start
    while True:
        data = os.pread(fd, min(BLOCK, total - at), at - kept_from) if at < total else b""
        at += len(data)
        for line in scanner.feed(data, final=not data):
            if len(found.lines) < SCREEN:
                found.lines.append(line)
                found.next = line.offset + line.length + 1
            elif pattern is None:  # a range alone: the rest is counted, not matched
                rest = _count_lines(fd, line.offset - kept_from, size)
                found.more = rest if last is None else min(rest, last - line.number + 1)
                return _finish(found, total)
            else:
                found.more += 1
        if len(found.lines) == SCREEN and pattern is not None and not scanner.counting:
            scanner.counting = True  # the screen is full: the rest is only counted
        found.more += scanner.counted
        scanner.counted = 0
        if not data or (last is not None and scanner.number > last):
            break
        if time.monotonic() > deadline:
            found.to, found.ended = at - len(scanner.carry), False
            break
    return _finish(found, total)


def _prefiltered(finder: LineFinder, block: bytes, end: int, base: int, found: list[tuple[int, bytes]],
                 at: int) -> None:
    """LineFinder._search where each matching line holds one of the literals: RE2 runs on those lines only.
    Each literal is found by a pattern of its own (RE2 finds a literal at memchr's speed, about 100 GB/s on
    lines without its first byte; Python's bytes.find runs at 3). Where a literal is on line after line that
    does not match (` ok` in prose), each would cost Python work: after MISSES of them in a block, the rest
    of it goes to RE2 alone, so that a prefilter is never much slower than none."""
    nearest = [_next(literal, block, at, end) for literal in finder.finders]
    misses = 0
    while at < end:
        if misses == MISSES:
            _plain(finder, block, end, base, found, at)
            return
        for index, where in enumerate(nearest):
            if 0 <= where < at:
                nearest[index] = _next(finder.finders[index], block, at, end)
        hits = [where for where in nearest if where >= 0]
        if not hits:
            return
        hit = min(hits)
        start = max(at, block.rfind(b"\n", at, hit) + 1)
        stop = block.find(b"\n", hit, end)
        stop = end if stop < 0 else stop
        if finder.pattern.search(block, start, stop) is not None:
            found.append((base + start, block[start:min(stop, start + LINE_SHOWN)]))
        else:
            misses += 1
        at = stop + 1


def _line_starts(finder: LineFinder, block: bytes, end: int, base: int, found: list[tuple[int, bytes]],
                 at: int) -> None:
    """LineFinder._search for a pattern whose every match starts a line: the first line searched alone, then
    each line after a newline that `finder.starts` (that newline, then the pattern) finds: RE2 skips from
    newline to newline with memchr, at about ten times its speed on the pattern alone."""
    start = at
    while start < end:
        stop = block.find(b"\n", start, end)
        stop = end if stop < 0 else stop
        if finder.pattern.search(block, start, stop) is not None:
            found.append((base + start, block[start:min(stop, start + LINE_SHOWN)]))
        hit = finder.starts.search(block, stop, end)
        if hit is None:
            return
        start = hit.start() + 1


def _next(literal: Any, block: bytes, at: int, end: int) -> int:
    match = literal.search(block, at, end)
    return -1 if match is None else match.start()


def line_at(fd: int, kept_from: int, offset: int) -> tuple[int, int]:
    """The offset of the line that `offset` falls in, and its number (1: the first line kept)."""
    line_start = _line_start(fd, kept_from, offset)
    return line_start, 1 + _count_newlines(fd, 0, line_start - kept_from)


def _finish(found: Found, total: int) -> Found:
    found.next = min(found.next, total) if found.lines else found.to
    return found


def _line_start(fd: int, kept_from: int, offset: int) -> int:
    """The offset of the line that `offset` falls in (within the kept bytes)."""
    at = offset
    while at > kept_from:
        begin = max(kept_from, at - 65536)
        chunk = os.pread(fd, at - begin, begin - kept_from)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            return begin + newline + 1
        at = begin
    return kept_from


def _count_newlines(fd: int, begin: int, end: int) -> int:
    """Newlines in the file's bytes [begin, end) (file positions)."""
    count, at = 0, begin
    while at < end:
        data = os.pread(fd, min(BLOCK, end - at), at)
        if not data:
            break
        count += data.count(b"\n")
        at += len(data)
    return count


def _count_lines(fd: int, begin: int, end: int) -> int:
    """Lines in the file's bytes [begin, end): its newlines, and one more for a last line not ended."""
    if end <= begin:
        return 0
    last = os.pread(fd, 1, end - 1)
    return _count_newlines(fd, begin, end) + (0 if last == b"\n" else 1)

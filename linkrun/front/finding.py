"""`read` with `lines` or `pattern`: the lines of a background command's
output or of a call's kept output that a range and a pattern select
(lines.py scans), as an answer.

Line 1 is the first line of the kept bytes: once bytes were dropped (a
cap), it is the rest of a line cut by the drop, and numbers shift as a
running command's output is cut again. Byte offsets count from the output's
first byte and never shift: a next page is asked for with `offset`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..detached import outread
from ..detached.lines import SCAN_SECONDS, Found, LineRange, compile_pattern, parse_range, scan
from ..errors import Refused
from ..messages.told import shown_word
from .ending import ended_fields, how_it_ended
from .kept import is_kept_id
from .results import ToolResult
from .waiting import END, MATCH, Waited, wait_seconds

if TYPE_CHECKING:
    from ..state.records import Shown
    from ..detached.background import Background
    from .kept import Kept


def find(arguments: dict[str, Any], meta: dict[str, Any], background: Background | None, kept: Kept | None,
         progress: Callable[[float, float], None] | None = None) -> ToolResult:
    """The lines found, or Refused (a bad range or pattern, an unknown id).

    With `wait` and `pattern` (not `lines`), a running command's output is
    waited on until a line matches (waiting.py); a call's kept output has
    ended, and is searched at once."""
    selected = parse_range(arguments["lines"]) if "lines" in arguments else LineRange()
    pattern = compile_pattern(arguments["pattern"]) if "pattern" in arguments else None
    wait = _wait(arguments)
    offset = arguments.get("offset")
    item_id = arguments.get("id")
    if wait and background is not None and not (kept is not None and is_kept_id(item_id)):
        from .waiting import wait_for_line

        record = background.own_record(item_id, meta)
        waited = wait_for_line(background, record, pattern, offset, wait, progress)
        return _answer(waited.record, waited.kept_from, waited.total, waited.found, arguments, waited)
    with _look(item_id, meta, background, kept) as look:
        total = look.kept_from + look.size
        if look.fd is None:
            found = Found(start=0, to=0, next=0)
        else:
            found = scan(look.fd, look.kept_from, look.size, pattern, selected, offset)
        return _answer(look.record, look.kept_from, total, found, arguments)


def _wait(arguments: dict[str, Any]) -> float:
    """The seconds to wait on a line: only with a pattern, and never with lines."""
    wait = wait_seconds(arguments)
    if wait and "lines" in arguments:
        raise Refused("wait is taken with pattern alone, not with lines",
                      "to wait for a line, give pattern and wait; to read lines as they are now, leave wait out")
    return wait


@contextlib.contextmanager
def _look(item_id: object, meta: dict[str, Any], background: Background | None, kept: Kept | None) -> Iterator[outread.Look]:
    """The output's file, open, with where it starts: kept output by the id's form, else a background command's."""
    if kept is not None and (background is None or is_kept_id(item_id)):
        with kept.opened(item_id, meta) as look:
            yield look
        return
    assert background is not None  # read is offered with one of the two
    record = background.own_record(item_id, meta)
    from ..detached.background import UNKNOWN

    with background.output_folder() as folder:
        try:
            with outread.looked_at(folder, background.state, record["id"]) as look:
                yield look
        except outread.Removed:
            raise Refused(UNKNOWN.format(id=item_id)) from None


def _answer(record: Shown, kept_from: int, total: int, found: Found, arguments: dict[str, Any],
            waited: Waited | None = None) -> ToolResult:
    shown = [f"{line.number} @{line.offset}: {line.data.decode('utf-8', errors='replace')}"
             + (f" [… {line.length - len(line.data)} more bytes of this line]" if line.length > len(line.data) else "")
             for line in found.lines]
    body = "\n".join(shown)
    notes = _notes(kept_from, found)
    if "wait" in arguments and arguments["wait"]:
        notes.insert(0, _waited_note(waited, record))
        if waited is not None and waited.lost:
            notes.append(f"{waited.lost} bytes were cut away by the cap before they could be searched")
    if not found.lines and record.get("tty") and "$" in str(arguments.get("pattern", "")):
        notes.append(r"a terminal ends each line with \r\n: end the pattern with \r?$ for a line's end")
    header = " · ".join([record["id"], how_it_ended(record), _what(arguments), _counted(found), *notes])
    structured = {
        "id": record["id"], "state": record["state"], "offset": found.start, "next": found.next,
        "kept_from": kept_from, "total": total, "text": body, "more": found.more, "searched_to": found.to,
        "lines": [{"line": line.number, "offset": line.offset, "text": line.data.decode("utf-8", errors="replace"),
                   "bytes": line.length} for line in found.lines],
        **ended_fields(record),
    }
    if "wait" in arguments and arguments["wait"]:
        structured["until"] = waited.until if waited is not None else END
        structured["waited"] = round(waited.seconds, 3) if waited is not None else 0.0
    return ToolResult(header + ("\n" + body if body else ""), structured, header=True, notes=notes)


def _waited_note(waited: Waited | None, record: Shown) -> str:
    """Why a wait on a line returned, first among the notes."""
    if waited is None:
        return "kept output has ended: searched at once"
    if waited.until == MATCH and waited.prompt:
        return f"a prompt matched after {waited.seconds:.2f} s: its last line, not ended, and it waits for input"
    if waited.until == MATCH:
        return f"a line matched after {waited.seconds:.2f} s"
    if waited.until == END:
        return f"it ended ({record['state']}) and no line after the offset matched"
    return (f"no line matched in {waited.seconds:.1f} s and it still runs: wait again with "
            f"offset={waited.found.next}")


def _what(arguments: dict[str, Any]) -> str:
    what = f"lines {arguments['lines']}" if "lines" in arguments else "lines"
    if str(arguments.get("lines", "")).startswith("-"):
        last = arguments["lines"][1:]
        what = "the last line" if last == "1" else f"the last {last} lines"
    if "pattern" in arguments:  # as it was given: repr would double each backslash
        what += f" matching {shown_word(arguments['pattern'])}"
    if "offset" in arguments:
        what += f" from byte {arguments['offset']}"
    return what


def _counted(found: Found) -> str:
    if not found.lines:
        return "none found"
    return f"{len(found.lines)} shown" + (f", {found.more} more" if found.more else "")


def _notes(kept_from: int, found: Found) -> list[str]:
    notes = []
    if kept_from:
        notes.append(f"bytes 0–{kept_from} were dropped (a cap keeps the last bytes) and not searched: line 1 "
                     f"starts at byte {kept_from}")
    if not found.ended:
        notes.append(f"the search stopped at byte {found.to} after {SCAN_SECONDS:g} s: read on with "
                     f"offset={found.to}")
    elif found.more:
        notes.append(f"read on with offset={found.next}")
    return notes

"""The read tool: its schema, an id to what it names (a background command's
output, or a call's kept output, kept.py), and its answer.

Both are read alike, by byte offset over [kept_from, total); a kept output
has ended, so `wait` returns at once on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..detached.lines import SCREEN
from ..state.records import LINE_SHOWN
from ..detached.outread import ReadChunk
from ..errors import Refused
from ..state.records import is_command_id
from .ending import ENDING_SCHEMA, ended_fields, how_it_ended
from .kept import Kept, is_kept_id
from .results import ToolResult
from .waiting import MAX_WAIT, wait_seconds

if TYPE_CHECKING:
    from ..state.records import Shown
    from ..config import Serve
    from ..detached.background import Background
    from .calls import CallContext



def read_tool(background: bool, kept: bool) -> dict[str, Any]:
    """The read tool, for what this serve offers: background commands, kept output, or both."""
    what = []
    if background:
        what.append("a background command's output (its id as start answered it)")
    if kept:
        what.append("a call's kept output (the id its answer gave where it cut a stream)")
    title = "Read a background command's output" if background and not kept else \
        "Read a call's kept output" if not background else "Read output"
    return {
        "name": "read", "title": title,
        "description": ("Read " + ", or ".join(what) + " from byte `offset` (go on from the answer's `next`), or "
                        "without offset its last bytes; `wait` (seconds, at most 30) waits for more output "
                        "or its end; `wait` with `pattern` waits until a line matching it is printed (say, "
                        "start a server, then wait for 'listening on')."),
        "inputSchema": {"type": "object", "properties": {
            "id": {"type": "string", "description": "The id of what to read, as start or command answered it."},
            "offset": {"type": "integer", "minimum": 0, "description": "The byte to read from, counted from its first byte."},
            "wait": {"type": "number", "minimum": 0, "maximum": MAX_WAIT,
                     "description": "Seconds to wait when there is nothing new yet (at most 30); with "
                                    "pattern, until a line matching it comes after offset, or the command ends "
                                    "(a prompt, its last line with no newline, matches once it waits for input)."},
            "lines": {"type": "string", "pattern": r"^(\d+(-\d*)?|-\d+)$",
                      "description": "Lines instead of bytes: 120-180 (lines 120 to 180), 120- (from line 120), "
                                     "120 (one line), -50 (the last 50). Line 1 is the first line kept."},
            "pattern": {"type": "string", "description": (
                "The lines matching this regular expression (RE2 syntax: as Python's re, without "
                "backreferences or lookarounds; a match stays within a line), with their line numbers and byte "
                f"offsets, at most {SCREEN} and a count of the rest; with lines, only within them; with offset, "
                "from there.")},
        }, "required": ["id"], "additionalProperties": False},
        "outputSchema": {"type": "object", "properties": {
            "id": {"type": "string"},
            "state": {"type": "string", "description": 'The command\'s state, or "kept" for a call\'s kept output.'},
            "offset": {"type": "integer"},
            "next": {"type": "integer"}, "kept_from": {"type": "integer"}, "total": {"type": "integer"},
            "dropped": {"type": "integer", "description": "Bytes lost to a full disk (only when some were)."},
            "text": {"type": "string", "description": "The returned bytes (offset to next), decoded; with lines or "
                     "pattern, the lines found as the answer's text shows them."},
            "lines": {"type": "array", "description": "With lines or pattern: the lines found, in order.",
                      "items": {"type": "object", "properties": {
                          "line": {"type": "integer"}, "offset": {"type": "integer"},
                          "text": {"type": "string", "description": f"At most {LINE_SHOWN} bytes of it."},
                          "bytes": {"type": "integer", "description": "The whole line's length."}},
                          "required": ["line", "offset", "text", "bytes"]}},
            "more": {"type": "integer", "description": "With lines or pattern: lines found past those shown."},
            "searched_to": {"type": "integer", "description": "With lines or pattern: the byte the search "
                            "stopped at (total, or where its time ran out)."},
            "until": {"type": "string", "enum": ["match", "end", "time"], "description": "With pattern and wait: "
                      "why the wait returned: a line matched, the command ended, or the wait's time ran out."},
            "waited": {"type": "number", "description": "With pattern and wait: the seconds it waited."},
            "waiting": {"type": "boolean", "description": "A background command's: whether it is blocked "
                        "reading its input (or terminal) now, with nothing left to read: a prompt waits."},
            **ENDING_SCHEMA,
        }, "required": ["id", "state", "offset", "next", "kept_from", "total", "text"]},
        "annotations": {"title": title, "readOnlyHint": True, "destructiveHint": False, "idempotentHint": True,
                        "openWorldHint": False},
    }



def offer_kept(settings: Serve, table: dict[str, dict[str, Any]]) -> Kept:
    """The kept output of this serve's calls, and read in `table` for it, with or without background commands."""
    assert settings.keep is not None  # offered only then
    way_in = settings.background is not None and settings.background.way_in is not None
    if "read" not in table:
        table["read"] = read_tool(background=False, kept=True)
    return Kept(settings.keep, way_in, settings.timeout)


def answer(arguments: dict[str, Any], context: CallContext, settings: Serve, background: Background | None,
           kept: Kept | None) -> ToolResult:
    """A read: of kept output when the id has its form, else of a background command."""
    offset = arguments.get("offset")
    if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int) or offset < 0):
        raise Refused("offset must be a whole number of bytes, 0 or more", "use the next of the last read")
    progress = context.progress
    report: Callable[[float, float], None] | None = None
    if progress is not None:
        def report(waited: float, wait: float) -> None:
            progress(waited, wait, "waiting for output")
    if background is None and is_command_id(arguments.get("id")):
        raise _no_background_commands(arguments["id"], settings)
    if "lines" in arguments or "pattern" in arguments:
        from .finding import find

        return find(arguments, context.meta, background, kept, report)
    if kept is not None and (background is None or is_kept_id(arguments.get("id"))):
        wait_seconds(arguments)  # checked alike, though a kept output has ended: nothing to wait for
        chunk = kept.read(arguments.get("id"), context.meta, offset, settings.output)
        return read_answer(chunk, offset, kept.settings.output, None)
    assert background is not None  # read is offered with one of the two
    chunk = background.read(arguments, context.meta, wait_seconds(arguments), report)
    background.answered_to(chunk.record["id"], chunk.next)
    result = read_answer(chunk, offset, background.b.output, background.state)
    show_waiting(result, background.state, chunk.record)
    return result


def _no_background_commands(command_id: str, settings: Serve) -> Refused:
    """A read of a background command's id where none runs: say that, and what turns them on."""
    from .offer import background_off

    return Refused(f"{command_id!r} is a background command's id, and this serve runs none "
                   f"(a kept output's id ends in -output or -errors); {background_off(settings)}")


WAITING = "waiting for input: it is blocked reading its input, with nothing left to read (write to it)"


def show_waiting(result: ToolResult, state: str, record: Shown) -> None:
    """A running command blocked on its input says so: a prompt waits, not silence."""
    from ..detached.input import waiting_for_input

    waiting = waiting_for_input(state, record)
    assert result.structured is not None  # a read's answer has its value
    result.structured["waiting"] = waiting
    if waiting:
        result.add_note(WAITING)


def read_answer(chunk: ReadChunk, asked: int | None, cap: int, state: str | None) -> ToolResult:
    """The structured value, and the text: a header line (id, state, the byte
    range, and any note), then exactly the bytes, so that no note can pass for
    the program's own output. `cap`: the bytes kept of it; `state`: the state
    folder, for a background command's refused hosts."""
    record = chunk.record
    text = chunk.data.decode("utf-8", errors="replace")
    # The text again: structured-first clients give the model this value alone.
    structured = {"id": record["id"], "state": record["state"], "offset": chunk.offset, "next": chunk.next,
                  "kept_from": chunk.kept_from, "total": chunk.total, "text": text}
    structured.update(ended_fields(record))
    dropped = record.get("dropped") or 0
    if dropped:
        structured["dropped"] = dropped
    notes = _read_notes(chunk, asked, dropped, cap, state)
    header = " · ".join([record["id"], how_it_ended(record), f"bytes {chunk.offset}–{chunk.next} of {chunk.total}",
                         *notes])
    return ToolResult(header + "\n" + text, structured, header=True, notes=notes)


def _read_notes(chunk: ReadChunk, asked: int | None, dropped: int, cap: int, state: str | None) -> list[str]:
    notes = []
    if asked is not None and asked < chunk.kept_from:
        full = f"; the disk was full: {dropped} of them were lost to it" if dropped else ""
        notes.append(f"bytes {asked}–{chunk.kept_from} dropped (only the last {cap} bytes are kept{full})")
    elif dropped and chunk.offset == chunk.kept_from:  # the losses lie before the kept bytes
        notes.append(f"the disk was full for a while: {dropped} bytes of its output were lost to it")
    if chunk.next == chunk.total and chunk.ended:
        notes.append("ended: no more output")
    elif chunk.next == chunk.total and not chunk.data:
        notes.append("nothing new yet: read again with wait")
    record = chunk.record
    leader = record.get("leader_pid")
    if state is not None and record.get("proxy") and leader:
        from ..calls.caller import refusals

        refused = refusals(state, record["started"], leader)
        if refused:
            notes.append(refused)
    return notes


RESOURCE_NOT_FOUND = -32002  # the spec's code for resources/read of an unknown uri


def resources(method: str, params: dict[str, Any], meta: dict[str, Any], kept: Kept) -> tuple[dict[str, Any], tuple[int, str] | None]:
    """resources/list and templates/list (empty: a kept output is reached by its link alone, so that no
    listing shows another conversation's), and resources/read of a link; (value, (code, message) or None)."""
    if method == "resources/list":
        return {"resources": []}, None
    if method == "resources/templates/list":
        return {"resourceTemplates": []}, None
    uri = params.get("uri")
    if not isinstance(uri, str):
        return {}, (-32602, "resources/read needs a string uri")
    text = kept.resource(uri, meta)
    if text is None:
        # A trial: a harness followed the link without the call's _meta, and could not tell why it failed.
        return {}, (RESOURCE_NOT_FOUND, f"Resource not found: {uri} is no kept output of this conversation's "
                                        "(read it with the _meta of the call that linked it, its conversation's)")
    return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": text}]}, None

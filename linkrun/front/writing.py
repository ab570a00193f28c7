"""The write tool: text to a running background command's input, through its supervisor, and what it printed since.

The supervisor (detached/input.py) holds the program's input; serve asks it,
over its socket in the state folder, to write. One call is one request: a
write is never sent twice. The answer is a read from the byte the output had
reached before the write, so one call sends a line and shows its answer:
all of it, not its first bytes. It is complete once the program waits for
input again (a prompt is back), ends, or prints nothing for QUIET seconds;
at most `wait` seconds after the write.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..detached import input as program_input
from ..detached import outread
from ..detached.background import PROGRESS_EVERY
from ..errors import LinkRunError, Refused
from ..state import records
from .ending import ENDING_SCHEMA, how_it_ended
from .reading import read_answer, show_waiting
from .results import ToolResult
from .waiting import MAX_WAIT

if TYPE_CHECKING:
    from ..detached.background import Background
    from ..detached.outread import ReadChunk
    from ..state.records import Record
    from .calls import CallContext

DEFAULT_WAIT = 5.0  # seconds a write waits for its answer, at most: most answers are complete long before
HOLD = 0.5  # seconds the supervisor may hold a write's answer for the output after it (then serve looks)
STARTING_WAIT = 5.0  # seconds a write to a command still starting waits for it to run
QUIET = 0.5  # seconds without output after which a program that reads no more has answered
LOOK_EVERY = 0.05  # seconds between looks at a program that has not answered yet
GAP_MOST = 4096  # bytes printed between two answers that a write's answer begins with


def write_tool() -> dict[str, Any]:
    return {
        "name": "write", "title": "Write to a background command",
        "description": ("Type text into a running background command's input (its terminal, when started with "
                        "tty): a line ends with \\n; control characters go as given (\\u0003 is Ctrl-C on a "
                        "terminal, \\u0004 Ctrl-D). Answers with what it printed since, as read does, once "
                        f"it waits for input again, ends, or prints nothing for {QUIET:g} s; at most `wait` "
                        f"seconds (default {DEFAULT_WAIT:g}; 0 answers at once). `eof` closes its input after "
                        "the text. A command started with input has had its input: it takes no more."),
        "inputSchema": {"type": "object", "properties": {
            "id": {"type": "string", "description": "The command's id, as start answered it."},
            "text": {"type": "string", "description": "What to write, exactly (up to 64 KiB as UTF-8)."},
            "eof": {"type": "boolean", "description": "Close its input after the text (a pipe's end of file)."},
            "wait": {"type": "number", "minimum": 0, "maximum": MAX_WAIT,
                     "description": "Seconds to wait for its answer after the write, at most (up to 30)."},
        }, "required": ["id"], "additionalProperties": False},
        "outputSchema": {"type": "object", "properties": {
            "id": {"type": "string"}, "state": {"type": "string"}, "written": {"type": "integer"},
            "offset": {"type": "integer"}, "next": {"type": "integer"}, "kept_from": {"type": "integer"},
            "total": {"type": "integer"}, "text": {"type": "string"},
            "waiting": {"type": "boolean", "description": "Whether it is blocked reading its input now."},
            **ENDING_SCHEMA,
        }, "required": ["id", "state", "written", "offset", "next", "kept_from", "total", "text", "waiting"]},
        "annotations": {"title": "Write to a background command", "readOnlyHint": False, "destructiveHint": True,
                        "idempotentHint": False, "openWorldHint": False},
    }


def answer(background: Background, arguments: dict[str, Any], context: CallContext) -> ToolResult:
    meta, progress = context.meta, context.progress
    report: Callable[[float, float], None] | None = None
    if progress is not None:
        def report(waited: float, wait: float) -> None:
            progress(waited, wait, "waiting for its answer")
    record = background.own_record(arguments.get("id"), meta)
    data, eof, wait = _checked(arguments)
    record = _running(background, record)
    command_id: str = record["id"]
    with background.output_folder() as folder:
        before = outread.output_total(folder, background.state, command_id) or 0
    # The supervisor answers once the program's output after the write is in its file (or `hold` is over):
    # then one read finds it, with no file watch started. Past `hold`, the read waits on the watch.
    hold = min(wait, HOLD)
    began = time.monotonic()
    reply = program_input.ask(background.state, command_id, {"op": "write", "eof": eof}, data, hold)
    if reply is None:  # it ended, or its supervisor is gone: the answer says how, once the record says it
        raise _no_input(background.settled(command_id))
    if "error" in reply:
        raise Refused(f"nothing was written to {command_id}: {reply['error']}")
    chunk = background.read({"id": command_id, "offset": before}, meta, 0)
    if not reply.get("output"):
        chunk = _first_output(background, chunk, before, began, wait, meta, report)
    if chunk.data and not chunk.ended and wait > 0:
        echo = data.replace(b"\n", b"\r\n") if record.get("tty") else b""
        chunk = _answered(background, chunk, before, echo, began + wait, meta)
    start = background.answered.get(command_id, before)
    # What it printed after the last answer and before this write (a prompt late to the file) is not skipped;
    # more than a prompt's few lines is left to read, so that the write's own reply stays in its answer.
    if chunk.kept_from <= start < before and before - start <= GAP_MOST:
        chunk = background.read({"id": command_id, "offset": start}, meta, 0)
    else:
        start = before
    background.answered_to(command_id, chunk.next)
    result = read_answer(chunk, start, background.b.output, background.state)
    show_waiting(result, background.state, chunk.record)
    result.add_note(f"wrote {len(data)} byte{'' if len(data) == 1 else 's'}" + (" and closed its input" if eof else ""))
    if b"\x03" in data and not record.get("tty"):  # Ctrl-C is an interrupt only where a terminal makes it one
        result.add_note("its \\u0003 went as a plain byte: without tty no terminal turns it into an interrupt; "
                        "stop ends the command")
    assert result.structured is not None  # a read's answer has its value
    result.structured.update({"written": len(data), "waiting": result.structured.get("waiting", False)})
    return result


def _first_output(background: Background, chunk: ReadChunk, before: int, began: float, wait: float,
                  meta: dict[str, Any], report: Callable[[float, float], None] | None) -> ReadChunk:
    """The output after the write once some comes, or the command ends; or, from a program that printed
    nothing, once it waits for input again (it took the write silently), or `wait` seconds after `began`.
    Its progress is reported from the write, at most every PROGRESS_EVERY seconds, not per short read."""
    command_id, deadline, reported = chunk.record["id"], began + wait, None
    while not (chunk.data or chunk.ended) and (now := time.monotonic()) < deadline:
        if program_input.waiting_for_input(background.state, chunk.record):
            # The look moved what it printed before it went to wait into the file, after `chunk` was read.
            return background.read({"id": command_id, "offset": before}, meta, 0)
        if report is not None and (reported is None or now - reported >= PROGRESS_EVERY):
            report(round(now - began, 1), wait)
            reported = now
        chunk = background.read({"id": command_id, "offset": before}, meta, min(LOOK_EVERY, deadline - now))
    return chunk


def _answered(background: Background, chunk: ReadChunk, before: int, echo: bytes, deadline: float,
              meta: dict[str, Any]) -> ReadChunk:
    """The output from `before` once the program's answer is complete (the module's docstring says
    when); `chunk` is its first bytes. Its supervisor's look says it waits only once it went back to
    wait after the write, with what it printed in the file: a program woken by the write, or by a
    terminal's echo of it, is not waiting until it has run (a process woken has no wait channel).
    On a terminal, quiet after no more than the `echo` of the write is a program at work, not done."""
    command_id, reached, quiet_since, more = chunk.record["id"], chunk.next, time.monotonic(), chunk
    printed = chunk.data[:len(echo) + 1]
    while not program_input.waiting_for_input(background.state, more.record):
        now = time.monotonic()
        if (now - quiet_since >= QUIET and not echo.startswith(printed)) or now >= deadline:
            break
        more = background.read({"id": command_id, "offset": reached}, meta, min(LOOK_EVERY, deadline - now))
        if more.data:
            reached, quiet_since = more.next, time.monotonic()
            printed = (printed + more.data)[:len(echo) + 1]
        if more.ended:
            break
    return background.read({"id": command_id, "offset": before}, meta, 0)


def _checked(arguments: dict[str, Any]) -> tuple[bytes, bool, float]:
    text = arguments.get("text", "")
    if not isinstance(text, str):
        raise Refused("text must be a string")
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > program_input.MOST:
        raise Refused(f"text is {len(data)} bytes; a write takes at most {program_input.MOST}",
                      "write it in parts, each answered before the next")
    eof = arguments.get("eof", False)
    if not isinstance(eof, bool):
        raise Refused("eof must be true or false")
    if not data and not eof:
        raise Refused("nothing to write", "give text, or eof to close its input")
    wait = arguments.get("wait", DEFAULT_WAIT)
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= MAX_WAIT:
        raise Refused(f"wait must be a number of seconds from 0 to {MAX_WAIT:g}")
    return data, eof, float(wait)


def _running(background: Background, record: Record) -> Record:
    """The record once its program runs: a command just started may still be starting."""
    if record["state"] == records.State.STARTING:
        record = background.record_until(record["id"], STARTING_WAIT,
                                         lambda record: record["state"] != records.State.STARTING)
    if record["state"] not in records.RUNNING_STATES:
        raise _no_input(record)
    return record


def _no_input(record: Record) -> LinkRunError:
    if record["state"] not in records.RUNNING_STATES:
        return Refused(f"{record['id']} has ended, {how_it_ended(record)}: it takes no more input",
                       "start it again to talk to a new one")
    return Refused(f"{record['id']} is ending: it takes no more input", "list shows how it ended")

"""The background tools' part of the tool layer: their schemas and answers.

background.py works on records and output files and returns plain values;
here they become what a client sees: the structured value and the text.
"""

from __future__ import annotations

from ..state import layout, records
from ..detached.background import MAX_WAIT, background_settings
from ..config import Serve
from ..units import format_duration
from ..detached.outfile import ReadChunk
from .results import ToolResult, nullable

_ID = {"type": "string", "description": "The command's id, as start answered it."}
_ENTRY = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "program": {"type": "string"},
        "args": {"type": "array", "items": {"type": "string"}},
        "folder": {"type": "string"},
        "state": {"type": "string", "enum": list(records.RUNNING_STATES + records.ENDED_STATES)},
        "exit": nullable("integer"),
        "signal": nullable("string"),
        "seconds": {"type": "number"},
        "bytes": {"type": "integer"},
        "started": {"type": "string"},
        "told": {"type": "string", "enum": list(records.TO_TELL + records.SETTLED)},
        "limit": nullable("string", 'The limit that bit: "memory" (its out-of-memory killer killed), '
                          '"tasks" (a fork was refused at its task limit), "cpu" (it used up its CPU time, '
                          'an rlimit where no cgroup holds the cap), or null.'),
        "unreadable": {"type": "string", "description": "Only when its output file could not be read now: why "
                       "(bytes is then what its record last said)."},
    },
    "required": ["id", "program", "args", "folder", "state", "exit", "signal", "seconds", "bytes", "started", "told",
                 "limit"],
}


def tool_table(run_properties: dict, settings: Serve) -> dict[str, dict]:
    b = background_settings(settings)
    no_way_in = b.way_in is None
    told = ("use list, and read with wait, to learn how it ended" if no_way_in
            else "a message from run:<id> tells this conversation how it ended")
    hints = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": settings.proxy}
    read_only = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}
    return {
        "start": {
            "name": "start", "title": "Start a background command",
            "description": (f"Start a program as command would, in the background, and answer at once with its id; "
                            f"it runs for at most {format_duration(b.timeout)}, and {told}. Its output, both "
                            f"streams as one, goes to {layout.shown_output('<id>')} in the files folder."),
            "inputSchema": {"type": "object", "properties": run_properties, "required": ["program"],
                            "additionalProperties": False},
            "outputSchema": {"type": "object", "properties": {"id": {"type": "string"}, "output": {"type": "string"}},
                             "required": ["id", "output"]},
            "annotations": {"title": "Start a background command", **hints},
        },
        "list": {
            "name": "list", "title": "List background commands",
            "description": "Each background command this conversation started, running or ended, newest first.",
            "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
            "outputSchema": {"type": "object", "properties": {"commands": {"type": "array", "items": _ENTRY}},
                             "required": ["commands"]},
            "annotations": {"title": "List background commands", **read_only},
        },
        "read": {
            "name": "read", "title": "Read a background command's output",
            "description": ("A background command's output from byte `offset` (go on from the answer's `next`), or "
                            "without offset its last bytes; `wait` (seconds, at most 30) waits for more output "
                            "or its end."),
            "inputSchema": {"type": "object", "properties": {
                "id": _ID,
                "offset": {"type": "integer", "minimum": 0, "description": "The byte to read from, counted from its first byte."},
                "wait": {"type": "number", "minimum": 0, "maximum": MAX_WAIT,
                         "description": "Seconds to wait when there is nothing new yet (at most 30)."},
            }, "required": ["id"], "additionalProperties": False},
            "outputSchema": {"type": "object", "properties": {
                "id": {"type": "string"}, "state": {"type": "string"}, "offset": {"type": "integer"},
                "next": {"type": "integer"}, "kept_from": {"type": "integer"}, "total": {"type": "integer"},
                "dropped": {"type": "integer", "description": "Bytes lost to a full disk (only when some were)."},
                "text": {"type": "string", "description": "The returned bytes (offset to next), decoded."},
            }, "required": ["id", "state", "offset", "next", "kept_from", "total", "text"]},
            "annotations": {"title": "Read a background command's output", **read_only},
        },
        "stop": {
            "name": "stop", "title": "Stop a background command",
            "description": "Stop a background command with everything it started, and answer how it ended.",
            "inputSchema": {"type": "object", "properties": {"id": _ID}, "required": ["id"], "additionalProperties": False},
            "outputSchema": _ENTRY,
            "annotations": {"title": "Stop a background command", "readOnlyHint": False, "destructiveHint": True,
                            "idempotentHint": True, "openWorldHint": False},
        },
    }


def start_answer(command_id: str, program: str, args: tuple[str, ...], settings: Serve) -> ToolResult:
    output = layout.shown_output(command_id)
    how = (f"a message from run:{command_id} will tell this conversation how it ended"
           if background_settings(settings).way_in else "use read with wait, or list, to learn how it ends")
    text = (f"Started {command_id}: {program} {' '.join(args)}".rstrip()
            + f"\nIts output goes to {output}; " + how + ".")
    return ToolResult(text, {"id": command_id, "output": output})


def list_answer(entries: list[dict]) -> ToolResult:
    return ToolResult(list_text(entries), {"commands": entries})


def stop_answer(entry: dict) -> ToolResult:
    return ToolResult(list_text([entry]), entry)


LIMIT_ENDINGS = {"memory": ", killed at its memory limit", "tasks": ", a fork refused at its task limit",
                 "cpu": ", killed at its CPU time (SIGXCPU)"}


def how_it_ended(record: dict) -> str:
    """Its state, and once it ended its exit status or signal and the limit that bit:
    "exited (exit 137), killed at its memory limit"."""
    how = str(record["state"])
    if record.get("exit") is not None:
        how += f" (exit {record['exit']})"
    elif record.get("signal"):
        how += f" ({record['signal']})"
    return how + LIMIT_ENDINGS.get(record.get("limit") or "", "")


def list_text(entries: list[dict]) -> str:
    if not entries:
        return "No background command of this conversation's."
    lines = []
    for e in entries:
        how = how_it_ended(e)
        command = " ".join([e["program"], *e["args"]])
        lines.append(f"{e['id']} · {how} · {e['seconds']:.1f} s · {e['bytes']} bytes · started {e['started']} · "
                     f"told: {e['told']}\n  {command}  (in {e['folder']})")
        if "unreadable" in e:
            lines.append(f"  output unreadable: {e['unreadable']}")
    return "\n".join(lines)


def read_answer(chunk: ReadChunk, asked: int | None, settings: Serve) -> ToolResult:
    """The structured value, and the text: a header line (id, state, the byte
    range, and any note), then exactly the bytes, so that no note can pass for
    the program's own output."""
    record = chunk.record
    text = chunk.data.decode("utf-8", errors="replace")
    # The text again: structured-first clients give the model this value alone.
    structured = {"id": record["id"], "state": record["state"], "offset": chunk.offset, "next": chunk.next,
                  "kept_from": chunk.kept_from, "total": chunk.total, "text": text}
    dropped = record.get("dropped") or 0
    if dropped:
        structured["dropped"] = dropped
    notes = _read_notes(chunk, asked, dropped, settings)
    header = " · ".join([record["id"], how_it_ended(record), f"bytes {chunk.offset}–{chunk.next} of {chunk.total}",
                         *notes])
    return ToolResult(header + "\n" + text, structured, header=True, notes=notes)


def _read_notes(chunk: ReadChunk, asked: int | None, dropped: int, settings: Serve) -> list[str]:
    b = background_settings(settings)
    notes = []
    if asked is not None and asked < chunk.kept_from:
        full = f"; the disk was full: {dropped} of them were lost to it" if dropped else ""
        notes.append(f"bytes {asked}–{chunk.kept_from} dropped (only the last "
                     f"{b.output} bytes are kept{full})")
    elif dropped and chunk.offset == chunk.kept_from:  # the losses lie before the kept bytes
        notes.append(f"the disk was full for a while: {dropped} bytes of its output were lost to it")
    if chunk.next == chunk.total and chunk.ended:
        notes.append("ended: no more output")
    elif chunk.next == chunk.total and not chunk.data:
        notes.append("nothing new yet: read again with wait")
    record = chunk.record
    if record.get("proxy") and record.get("leader_pid"):
        from ..network.internet import refused, refused_note

        hosts = refused(b.state, record["started"], record["leader_pid"])
        if hosts:
            notes.append(refused_note(hosts, b.state))
    return notes

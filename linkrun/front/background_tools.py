"""The background tools' part of the tool layer: their schemas and answers.

background.py works on records and output files and returns plain values;
here they become what a client sees: the structured value and the text.
"""

from __future__ import annotations

from ..state import layout, records
from ..detached.background import background_settings
from ..config import Serve
from ..messages.told import shown_command
from ..units import format_duration
from .reading import answer as read  # noqa: F401  (the tool layer finds every background tool's answer here)
from .ending import how_it_ended
from .reading import read_tool
from .results import ToolResult, nullable
from .writing import write_tool

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["read", "tool_table", "start_answer", "list_answer", "stop_answer"]

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
        "limit": nullable("string", 'The limit that bit: "memory" (its out-of-memory killer killed; where '
                          'no cgroup holds memory, an allocation was refused), '
                          '"tasks" (a fork was refused at its task limit), "cpu" (it used up its CPU time, '
                          'an rlimit where no cgroup holds the cap), "file" (a write past the largest file it may write '
                          'was refused), or null.'),
        "waiting": {"type": "boolean", "description": "Whether it is blocked reading its input (or terminal), "
                    "with nothing left to read: a prompt waits for a write."},
        "unreadable": {"type": "string", "description": "Only when its output file could not be read now: why "
                       "(bytes is then what its record last said)."},
    },
    "required": ["id", "program", "args", "folder", "state", "exit", "signal", "seconds", "bytes", "started", "told",
                 "limit"],
}


# The instructions' last sentences on background commands: how their ends (and lines) are learnt.
TELL_ON = {"tell_on": {"type": "string", "description": (
    "A regular expression (RE2 syntax, matched within each line): each line of its output that matches is told "
    "to this conversation as it comes, in a message from run:<id>:lines:<n> (at most one a minute, the lines "
    "found meanwhile gathered into the next), such as 'listening on|ERROR'.")}}


# start's input: given once, as command's, or else left open for write.
START_INPUT = {"input": {"type": "string", "description": (
    "Text for its standard input, given once, then its end; without it, its input stays open for write.")}}
# start's terminal: a program that needs one (a REPL, a prompt, a debugger), typed into with write.
TTY = {
    "tty": {"type": "boolean", "description": (
        "Run it on a terminal of its own inside its sandbox (a REPL, a debugger, a program that asks on a "
        "terminal): its input is the terminal, typed into with write; its output file holds what the terminal "
        "printed, echoed input and line ends as \\r\\n included.")},
    "columns": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "With tty: its width (default 80)."},
    "rows": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "With tty: its height (default 24)."},
}


def tool_table(run_properties: dict[str, Any], settings: Serve) -> dict[str, dict[str, Any]]:
    b = background_settings(settings)
    no_way_in = b.way_in is None
    told = ("use list, and read with wait, to learn how it ended (read with pattern and wait waits on a line)"
            if no_way_in else "a message from run:<id> tells this conversation how it ended (and with tell_on, "
            "of the lines that match as they come)")
    hints = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": settings.proxy}
    read_only = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}
    return {
        "start": {
            "name": "start", "title": "Start a background command",
            "description": (f"Start a program as command would, in the background, and answer at once with its id; "
                            f"it runs for at most {format_duration(b.timeout)}, and {told}. Its output, both "
                            f"streams as one, goes to {layout.shown_output('<id>')} in the files folder."),
            "inputSchema": {"type": "object", "properties": {**run_properties, **START_INPUT, **TTY} if no_way_in else
                            {**run_properties, **START_INPUT, **TTY, **TELL_ON},
                            "required": ["program"], "additionalProperties": False},
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
        "read": read_tool(background=True, kept=settings.keep is not None),
        "write": write_tool(),
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
    text = f"Started {command_id}: {shown_command(program, args)}\nIts output goes to {output}; {how}."
    return ToolResult(text, {"id": command_id, "output": output})


def list_answer(entries: list[dict[str, Any]]) -> ToolResult:
    return ToolResult(list_text(entries), {"commands": entries})


def stop_answer(entry: dict[str, Any]) -> ToolResult:
    return ToolResult(list_text([entry], told_once=False), entry)


# list's last line where no command's end is told: said once, not on each command's line.
NONE_TOLD = (f"No message tells of their ends here (told: {records.Told.NO_WAY_IN}): list, and read with wait, "
             "say how each went.")


# The most of a command line list shows: a long script is told apart by its start; the structured value has it whole.
COMMAND_SHOWN = 200


def _cut(line: str) -> str:
    if len(line) <= COMMAND_SHOWN:
        return line
    return f"{line[:COMMAND_SHOWN]}… ({len(line) - COMMAND_SHOWN} characters more)"


def list_text(entries: list[dict[str, Any]], told_once: bool = True) -> str:
    """Two lines a command: how it is, then its command line, on one line whatever its arguments hold.
    `told_once`: where none is told (no way in), say so once at the end, not on each command's line."""
    if not entries:
        return "No background command of this conversation's."
    none_told = told_once and all(e["told"] == records.Told.NO_WAY_IN for e in entries)
    lines = []
    for e in entries:
        how = how_it_ended(e)
        how += " · waiting for input" if e.get("waiting") else ""
        told = "" if none_told else f" · told: {e['told']}"
        lines.append(f"{e['id']} · {how} · {e['seconds']:.1f} s · {e['bytes']} bytes · started {e['started']}{told}"
                     f"\n  {_cut(shown_command(e['program'], e['args']))}  (in {e['folder']})")
        if "unreadable" in e:
            lines.append(f"  output unreadable: {e['unreadable']}")
    return "\n".join(lines + [NONE_TOLD] if none_told else lines)

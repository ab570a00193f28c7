"""The tool table: names, schemas, dispatch; arguments → requests
(arguments.py), outcomes → content (command_answer.py, background_tools.py).

A tool call arrives here as (name, arguments, context); what leaves is a
ToolResult whose text is for the agent and whose structured value is for
programs. Refusals (Refused) become tool errors that say what was wrong and
what is allowed. How a call runs is not decided here: `command` hands its
request to the owner of serve's calls (calls/caller.py) and words the
outcome; `start` has the owner try its launch before the record is made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..calls.caller import Caller
from ..processes import runner
from .kept import KEPT_SCHEMA, Kept, kept_links
from .reading import offer_kept
from .calls import CallContext
from .arguments import QUOTE_MAX, check_run, cut_values, quoted
from .command_answer import (LIMITS_SCHEMA, command_structured, command_text, git_note, lookup_note,
                             unreached_server_note)
from ..config import Serve
from ..errors import LinkRunError, Refused
from .offer import Offer, background_off
from .results import ToolResult, nullable

if TYPE_CHECKING:
    from ..detached.background import Background


_RUN_PROPERTIES = {
    "program": {
        "type": "string",
        "description": "The program: a bare name found on the PATH (such as python3) or an absolute path. No shell: for a pipeline, run sh with -c.",
    },
    "args": {
        "type": "array",
        "items": {"type": "string"},
        "description": "Its arguments, passed as they are (no shell quoting needed).",
    },
    "input": {
        "type": "string",
        "description": "Text for its standard input; without it, the input is empty.",
    },
    "folder": {
        "type": "string",
        "description": "The folder to run in, relative to the files folder, or its absolute path inside it "
                       "(default: the files folder itself).",
    },
}


_SHOWN = ("its kept start and end as text, with [… N bytes left out …] where it was cut, "
          "as the answer's text shows them")
_COMMAND_OUTPUT = {
    "type": "object",
    "properties": {
        "exit": nullable("integer", "Exit status, or null when a signal ended it."),
        "signal": nullable("string", "The signal that ended it, such as SIGKILL, or null."),
        "timed_out": {"type": "boolean"},
        "output_bytes": {"type": "integer", "description": "All the bytes it wrote on its output, kept or not."},
        "errors_bytes": {"type": "integer", "description": "All the bytes it wrote on its errors, kept or not."},
        "seconds": {"type": "number"},
        "output": {"type": "string", "description": f"What it printed on its output: {_SHOWN}."},
        "errors": {"type": "string", "description": f"What it printed on its errors: {_SHOWN}."},
        "limit": nullable("string", 'The limit that bit: "memory" when its out-of-memory killer killed (or, '
                          'where an rlimit holds it, its errors, or its output when they are empty, show an '
                          'allocation refused), "tasks" when a fork was refused at its task limit, "cpu" when it '
                          'used up its CPU time (an rlimit), "file" when a write past the largest file it may write '
                          'was refused (SIGXFSZ, or EFBIG in its errors), else null.'),
        "limits": LIMITS_SCHEMA,
        **KEPT_SCHEMA,
    },
    "required": ["exit", "signal", "timed_out", "output_bytes", "errors_bytes", "seconds", "output", "errors",
                 "limit"],
}
# The tools of background commands, offered only with them on (read also with kept output).
BACKGROUND_TOOLS = ("start", "list", "read", "write", "stop")
# Of every tool's structured value, present only when not empty.
_EVERY_TOOLS_OUTPUT = {
    name: {"type": "array", "items": {"type": "string"}, "description": description} for name, description in (
        ("ignored", "The arguments given that this tool does not know, which it ignored."),
        ("notes", "The server's notes on this answer, each as the text has it: the proxy refused a host, the "
                  "sandbox refused a write, the call had no internet, a limit bit, arguments were ignored."))}


class Tools:
    """The tools this server offers, built once from its settings."""

    def __init__(self, settings: Serve, offer: Offer | None = None) -> None:
        self.settings = settings
        offer = offer if offer is not None else Offer(settings)  # what the instructions said: the same objects
        self.programs = offer.programs
        self.caller = Caller(settings, offer.setup)  # runs the calls: the tool layer only words them
        self.table: dict[str, dict[str, Any]] = {}
        self.background: Background | None = None
        if settings.programs:
            self.table["command"] = self._command_tool()
        if settings.offers_background:
            from ..detached.background import Background
            from .background_tools import tool_table

            self.background = Background(settings, self.caller.files_descriptor)
            table = tool_table(dict(_RUN_PROPERTIES), settings)
            if not settings.programs:
                del table["start"]
            self.table.update(table)
        self.kept: Kept | None = offer_kept(settings, self.table) if settings.keep is not None else None
        for tool in self.table.values():
            schema = tool["outputSchema"]
            tool["outputSchema"] = {**schema, "properties": {**schema["properties"], **_EVERY_TOOLS_OUTPUT}}

    def first_answered(self) -> None:
        """After the session's first answer: what may wait until then."""
        if self.background is not None:
            self.background.ready.set()
        self.caller.started()

    def close(self) -> None:
        """At serve's end, once the calls answered or were killed."""
        self.caller.close()

    # -- listing ---------------------------------------------------------

    def _command_tool(self) -> dict[str, Any]:
        properties = dict(_RUN_PROPERTIES)
        properties["timeout"] = {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": self.settings.timeout,
            "description": f"Seconds before it is killed (at most {self.settings.timeout}, the default).",
        }
        return {
            "name": "command",
            "title": "Run a program",
            "description": (
                "Run one program in the files folder, in a sandbox of its own that ends with the call, "
                "and answer how it ended and what it printed (the start and end of each stream)."
            ),
            "inputSchema": {
                "type": "object",
                "properties": properties,
                "required": ["program"],
                "additionalProperties": False,
            },
            "outputSchema": _COMMAND_OUTPUT,
            "annotations": {
                "title": "Run a program",
                "readOnlyHint": False,
                "destructiveHint": True,
                "idempotentHint": False,
                "openWorldHint": self.settings.proxy,
            },
        }

    def unknown(self, name: str) -> str:
        """The error for a call of a tool not offered: the tools that are, and
        for a background tool, what turns background commands on."""
        text = f"Unknown tool: {name} (tools: {', '.join(self.table) or 'none'})"
        if name not in BACKGROUND_TOOLS:
            return text
        off = background_off(self.settings)
        if off is not None:
            return f"{text}; {off}"
        return f"{text}; start is off: the sandbox file allows no program"

    def listing(self, version: str) -> list[dict[str, object]]:
        """The tools as a client at `version` may see them (fields by revision)."""
        tools = []
        for tool in self.table.values():
            shown = {"name": tool["name"], "description": tool["description"], "inputSchema": tool["inputSchema"]}
            if version >= "2025-03-26":
                shown["annotations"] = tool["annotations"]
            if version >= "2025-06-18":
                shown["title"] = tool["title"]
                shown["outputSchema"] = tool["outputSchema"]
            tools.append(shown)
        return tools

    # -- calling ---------------------------------------------------------

    def call(self, name: str, arguments: dict[str, object], context: CallContext) -> ToolResult | None:
        """Run a tool; None when the call was cancelled (no answer is sent).

        An argument the tool does not know is ignored and named in the answer
        (Gemini CLI adds `wait_for_previous` to every call; a misspelt
        `timout` must still be seen). A null is an absent argument (LangChain
        adapters and OpenAI strict schemas send every optional one)."""
        known = self.table[name]["inputSchema"]["properties"]
        ignored = sorted(key if len(key) <= QUOTE_MAX else quoted(key) for key in set(arguments) - set(known))
        given = {key: value for key, value in arguments.items() if key in known and value is not None}
        result = self._answer(name, given, context)
        if result is not None and ignored:
            # tell_on is start's only with a way in, which tells: without one, a wait on a line is read's.
            told = "; nothing is told here: read with pattern and wait waits for a line" \
                if name == "start" and "tell_on" in ignored else ""
            result.add_note(f"[ignored {', '.join(ignored)}: not arguments of this tool, whose arguments are "
                            f"{', '.join(sorted(known)) or 'none'}{told}]")
            if result.structured is not None:
                result.structured["ignored"] = ignored
        if result is not None and result.notes and result.structured is not None:
            result.structured["notes"] = list(result.notes)
        return result

    def _where_ids_come_from(self) -> str:
        """What a tool that takes an id says when it is missing: where this serve's ids come from."""
        if self.background is None:
            return "give the id that a command's answer named for its output"
        started = "give the id that start answered (list shows this conversation's commands)"
        return f"{started}, or the one a command's answer named for its output" if self.kept is not None else started

    def _answer(self, name: str, arguments: dict[str, object], context: CallContext) -> ToolResult | None:
        try:
            if name == "command":
                return self._command(arguments, context)
            return self._background(name, arguments, context)
        except Refused as refusal:
            return ToolResult(cut_values(f"Refused: {refusal}", arguments), is_error=True)
        except LinkRunError as failure:
            return ToolResult(cut_values(f"Failed: {failure}", arguments), is_error=True)

    def _background(self, name: str, arguments: dict[str, object], context: CallContext) -> ToolResult:
        from . import background_tools as answers

        if "id" in self.table[name]["inputSchema"].get("required", ()) and "id" not in arguments:
            raise Refused("id is missing", self._where_ids_come_from())
        if name == "read":  # of a background command, or of a call's kept output (reading.py)
            return answers.read(arguments, context, self.settings, self.background, self.kept)
        background = self.background
        assert background is not None  # its tools are in the table only then
        if name == "start":
            request = self.check_run(arguments)
            self.caller.check(request)
            command_id = background.start(request, self.caller.argv_tail(request), arguments, context.meta)
            started = answers.start_answer(command_id, str(arguments["program"]), request.args, self.settings)
            if (problem := background.key_problem()) is not None:  # a trial: it promised a message nothing sent
                started.add_note(f"[nothing tells this conversation yet: {problem}; its end is told once it is "
                                 "mended, and list and read with wait say it meanwhile]")
            return started
        if name == "list":
            return answers.list_answer(background.list(context.meta))
        if name == "write":
            from . import writing

            return writing.answer(background, arguments, context)
        return answers.stop_answer(background.stop(arguments, context.meta))

    def check_run(self, arguments: dict[str, object]) -> runner.Request:
        """The checks `command` and `start` share: arguments → a resolved Request."""
        return check_run(arguments, self.programs.resolve, self.settings.timeout, self.settings.files)

    def _command(self, arguments: dict[str, object], context: CallContext) -> ToolResult | None:
        request = self.check_run(arguments)
        progress = context.progress
        report: Callable[[float, int], None] | None = None
        if progress is not None:
            def report(seconds: float, total: int) -> None:  # seconds: they rise, the bytes need not
                progress(seconds, None, f"{total} bytes of output so far")
        keeping = self.kept.begin(context.meta) if self.kept is not None else None
        outcome = self.caller.run(request, context.cancel, report, keeping.keepers if keeping is not None else None,
                                  context.later)
        kept = self.kept.settle_call(keeping, outcome, arguments) if self.kept and keeping else None
        if outcome.cancelled:
            return None
        text, notes = command_text(outcome, request.timeout, self.settings, "start" in self.table, self.caller.holding, kept)
        result = ToolResult(text, command_structured(outcome, self.caller.holding, kept), notes=notes, links=kept_links(kept))
        if self.kept is not None and self.kept.owner(context.meta) is None and (outcome.output.left_out or outcome.errors.left_out):
            # A trial: with a way in, a call that names no conversation was cut and said nothing of it.
            result.add_note("[nothing of what was left out is kept: this call named no conversation "
                            "(_meta link.local/thread), whose output alone is kept for read]")
        if outcome.git_notes:
            result.add_note(git_note(outcome.git_notes))
        if outcome.no_internet:
            result.add_note(f"[this call had no internet: {outcome.no_internet}]")
        elif outcome.refused:
            result.add_note(outcome.refused)
        if self.caller.sandbox.real:
            lookup = lookup_note(outcome, self.settings.proxy, self.programs.sandbox_file)
            if lookup is not None:
                result.add_note(lookup)
            running = self.background.running_of(context.meta) if self.background is not None and outcome.failed else []
            if (unreached := unreached_server_note(outcome, running)) is not None:
                result.add_note(unreached)
        return result

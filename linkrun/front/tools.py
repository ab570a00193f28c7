"""The tool table: names, schemas, dispatch; arguments → requests
(arguments.py), outcomes → content (command_answer.py, background_tools.py).

A tool call arrives here as (name, arguments, context); what leaves is a
ToolResult whose text is for the agent and whose structured value is for
programs. Refusals (Refused) become tool errors that say what was wrong and
what is allowed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import logger
from ..processes import runner
from .kept import KEPT_SCHEMA, Kept, kept_links
from .reading import offer_kept
from .arguments import QUOTE_MAX, check_exec_size, check_run, cut_values, quoted
from .command_answer import LIMITS_SCHEMA, command_structured, command_text, git_note, limit_warnings
from ..config import Serve
from ..errors import LinkRunError, Refused
from .offer import Offer
from ..processes.spare import LOADER_TAIL, NotNow, Spare, Spares, script
from ..sandboxing.launch import Launch, join_group, prepare, program_argv
from .results import ToolResult, nullable

if TYPE_CHECKING:
    from ..detached.background import Background
    from ..network.internet import Users


# A call's progress to its client: (progress, total, message).
Progress = Callable[[float, float | None, str | None], None]


@dataclass
class CallContext:
    """What the server knows of a call beyond its arguments."""

    meta: dict[str, object]
    cancel: runner.Cancel
    progress: Progress | None = None  # when the client asked for it


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
        "description": "The folder to run in, relative to the files folder (default: the files folder itself).",
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
                          'where an rlimit holds it, its errors show an allocation refused), "tasks" when a fork '
                          'was refused at its task limit, "cpu" when it used up its CPU time (an rlimit), else null.'),
        "limits": LIMITS_SCHEMA,
        **KEPT_SCHEMA,
    },
    "required": ["exit", "signal", "timed_out", "output_bytes", "errors_bytes", "seconds", "output", "errors",
                 "limit"],
}
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
        self.programs, self.offered, self.sandbox = offer.programs, offer.offered, offer.sandbox
        self._files_fd: int | None = None
        self._etc_watch_asked = threading.Lock()  # the first launch starts the watch, the others wait
        self._etc_watch_started = False
        # A sandbox made ahead of each call (spare.py), for a real sandbox with its init watched.
        self.spares = Spares(self._prepare_spare, self._start_spare, runner.end_spare) if self.sandbox.real else None
        self.table: dict[str, dict[str, Any]] = {}
        self.background: Background | None = None
        self.proxy: Users | None = None
        if settings.proxy and settings.state:
            from ..network.internet import Users

            self.proxy = Users(settings.state)
        if settings.programs:
            self.table["command"] = self._command_tool()
        if settings.offers_background:
            from ..detached.background import Background
            from .background_tools import tool_table

            self.background = Background(settings, self._files_descriptor)
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
        if self.settings.limits is not None:
            threading.Thread(target=self._say_limits_that_do_not_hold, daemon=True, name="limits").start()
        if self.proxy is not None:
            threading.Thread(target=self._proxy_ready, daemon=True, name="proxy").start()
        if self.spares is not None:
            self.spares.make()
        if self.sandbox.real:
            threading.Thread(target=self._end_strays, daemon=True, name="strays").start()

    def _end_strays(self) -> None:
        """The agent's sandboxes a killed serve or supervisor left behind (strays.py)."""
        from ..sandboxing import strays

        ended = strays.end(self.settings.files)
        if ended:
            logger.info(f"ended {ended} sandbox process(es) of this agent that a killed serve or "
                        f"supervisor had left behind")

    def _say_limits_that_do_not_hold(self) -> None:
        from ..sandboxing import cgroups  # not at start: initialize never waits for it

        assert self.settings.limits is not None  # started only with limits
        assert self.sandbox.holding is not None  # with limits
        for line in limit_warnings(self.sandbox.holding, cgroups.place()):
            logger.warning(line)

    def _proxy_ready(self) -> str | None:
        """Start the agent's proxy if none runs; None, or why the call has no internet."""
        assert self.proxy is not None  # called only with the proxy
        try:
            self.proxy.ensure()
            return None
        except (LinkRunError, OSError) as problem:
            why = problem.message if isinstance(problem, LinkRunError) else str(problem)
            logger.warning(why)
            return why

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
            result.add_note(f"[ignored {', '.join(ignored)}: not arguments of this tool, whose arguments are "
                            f"{', '.join(sorted(known)) or 'none'}]")
            if result.structured is not None:
                result.structured["ignored"] = ignored
        if result is not None and result.notes and result.structured is not None:
            result.structured["notes"] = list(result.notes)
        return result

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

        if name == "read":  # of a background command, or of a call's kept output (reading.py)
            return answers.read(arguments, context, self.settings, self.background, self.kept)
        background = self.background
        assert background is not None  # its tools are in the table only then
        if name == "start":
            request = self.check_run(arguments)
            os.close(runner.open_folder(self._files_descriptor(), request.folder))
            with self.launch(request, watch_init=False, git_check=False) as launch:  # a planted link: refused now
                check_exec_size(launch)
            command_id = background.start(request, self.argv_tail(request), arguments, context.meta)
            return answers.start_answer(command_id, str(arguments["program"]), request.args, self.settings)
        if name == "list":
            return answers.list_answer(background.list(context.meta))
        return answers.stop_answer(background.stop(arguments, context.meta))

    def _files_descriptor(self) -> int:
        if self._files_fd is None:
            self._files_fd = os.open(self.settings.files, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return self._files_fd

    def check_run(self, arguments: dict[str, object]) -> runner.Request:
        """The checks `command` and `start` share: arguments → a resolved Request."""
        return check_run(arguments, self.programs, self.settings.timeout)

    def argv_tail(self, request: runner.Request) -> list[str]:
        """What follows the sandbox's `--`: the program, through env when --var is given."""
        return program_argv(request.program, request.args, self.settings.variables)

    def launch(self, request: runner.Request, watch_init: bool = True, grouped: bool = True, git_check: bool = True) -> Launch:
        """The call's whole sandbox argv and its descriptors (see launch.py); a
        link planted on a path it binds is Refused, naming it."""
        self._watch_etc()
        return prepare(self.sandbox, self.argv_tail(request), request.folder, self._files_descriptor(), watch_init,
                       grouped, git_check)

    def _key(self, launch: Launch) -> tuple[object, ...]:
        """What a sandbox made now would show (Launch.key), and which proxy listens in it."""
        return launch.key, self.proxy.generation if self.proxy is not None else 0

    def _prepare_spare(self) -> tuple[Launch, tuple[object, ...]]:
        if self.proxy is not None and not self.proxy.running():
            raise NotNow  # a call starts the proxy and waits for it; a spare never does
        self._watch_etc()
        launch = prepare(self.sandbox, LOADER_TAIL, "", self._files_descriptor(), git_check=False)  # its call's looks
        return launch, self._key(launch)

    def _start_spare(self, launch: Launch, key: object) -> Spare:
        return runner.start_spare(launch, key, self.settings.files)

    def _take_spare(self, request: runner.Request, launch: Launch) -> Spare | None:
        """The spare for this call, handed its script; None when a sandbox is
        made for it (no spare shows what it would, or the one taken ended
        before it read the script: nothing of the call ran, its input is whole)."""
        if self.spares is None:
            return None
        data = script(request, self.argv_tail(request), self.settings.files)
        spare = self.spares.take(self._key(launch), use=data is not None)
        if spare is None or data is None:
            return None
        handed = spare.hand_over(data, bool(request.input))
        self.spares.handed(spare, handed)
        return spare if handed else None

    def _watch_etc(self) -> None:
        """At the first launch (not at start: initialize never waits for it),
        the watch of the host's /etc that lets a launch skip its look when
        nothing changed (etcview.EtcWatch), for a real sandbox that binds the
        agent's view. It runs until serve's end."""
        with self._etc_watch_asked:
            if self._etc_watch_started:
                return
            self._etc_watch_started = True
            at = self.sandbox.etc_view_at
            if self.sandbox.real and at >= 0:
                from ..sandboxing import etcview

                self.sandbox.etc_watch = etcview.EtcWatch.start(etcview.source_of(self.sandbox.fixed[at + 1]))

    def _command(self, arguments: dict[str, object], context: CallContext) -> ToolResult | None:
        request = self.check_run(arguments)
        folder_fd = runner.open_folder(self._files_descriptor(), request.folder)
        progress = context.progress
        report: Callable[[float, int], None] | None = None
        if progress is not None:
            def report(seconds: float, total: int) -> None:  # seconds: they rise, the bytes need not
                progress(seconds, None, f"{total} bytes of output so far")
        counted = False  # by the spares, as a call in flight
        keeping = self.kept.begin(context.meta) if self.kept is not None else None
        try:
            with self.launch(request, grouped=False) as launch:
                check_exec_size(launch)
                no_internet = self._proxy_ready() if self.proxy is not None else None
                since = time.time()
                counted = self.spares is not None
                spare = self._take_spare(request, launch)
                if spare is None:
                    join_group(launch, self.sandbox)
                try:
                    outcome = runner.run(request, launch, folder_fd, context.cancel, self.settings.output, report,
                                         spare, keeping.keepers if keeping is not None else None)
                finally:
                    if spare is not None:
                        spare.launch.close()
                no_internet = no_internet or launch.no_internet
        finally:
            os.close(folder_fd)
            if self.spares is not None:
                self.spares.done(counted)
        kept = self.kept.settle_call(keeping, outcome, arguments) if self.kept and keeping else None
        if outcome.cancelled:
            return None
        text, notes = command_text(outcome, request.timeout, self.settings, "start" in self.table,
                                   self.sandbox.holding, kept)
        result = ToolResult(text, command_structured(outcome, self.sandbox.holding, kept), notes=notes,
                            links=kept_links(kept))
        if launch.git_notes:
            result.add_note(git_note(launch.git_notes))
        if no_internet:
            result.add_note(f"[this call had no internet: {no_internet}]")
        elif self.proxy is not None and self.settings.state:
            from ..network.internet import refused, refused_note

            hosts = refused(self.settings.state, since, outcome.pid)
            if hosts:
                result.add_note(refused_note(hosts, self.settings.state))
        return result

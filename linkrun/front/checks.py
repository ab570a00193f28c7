"""The checks `up` hands serve to run after the handshake: the sandbox's
/etc view made current, then the sandbox started once and looked at
(the sandbox's probe).

`initialize` and `tools/list` never wait for them: `codex exec` asks its
model without a server's tools when the first answer takes more than about
a second, and on a loaded machine these checks took seconds. They start
once the first answer is out (run beside the handshake, they took its
interpreter and half its time), or when a call needs them. Only the calls
that run a program in the sandbox wait; when the checks failed, those calls
are refused with what failed and the fix, nothing runs unsandboxed, and
serve ends with exit 1.

`up` names them with serve's `--checks <agent's folder>` (the rest serve
has: its sandbox, write folders and filter), whether it runs serve in its
own process or execs it in a systemd scope: on both paths the handshake
comes first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from typing import TYPE_CHECKING

from .. import logger
from ..errors import LinkRunError

if TYPE_CHECKING:  # loaded with the tool layer, after the handshake
    from .results import ToolResult

CANNOT_START = "the sandbox cannot start here, so nothing runs"
# The tools that run a program in the sandbox: the others read records and files only.
HELD = frozenset({"command", "start"})


class Checks:
    """up's work, run once on a thread of its own, and the calls held until it ended."""

    def __init__(self, work: Callable[[], None] | None) -> None:
        self._work = work
        self._started = False
        self._ended = threading.Event()
        self._lock = threading.Lock()  # orders `after` with the end of the work
        self._then: list[Callable[[], None]] = []
        self.failure: LinkRunError | None = None
        if work is None:
            self._ended.set()

    def start(self) -> None:
        """Start the work, unless it was started."""
        with self._lock:
            if self._work is None or self._started:
                return
            self._started = True
        threading.Thread(target=self._run, args=(self._work,), daemon=True, name="checks").start()

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except LinkRunError as problem:
            self.failure = problem
        except Exception as problem:  # a bug of ours: still fail closed
            from ..invocation import typed

            self.failure = LinkRunError(f"the sandbox's checks failed: {problem!r}", f"run {typed('doctor')}")
        if self.failure is not None:
            # As `up` says it when it cannot start: one line, naming the fix.
            logger.error(str(self.failure))
        with self._lock:
            self._ended.set()
            then, self._then = self._then, []
        if self.failure is None:
            for each in then:
                each()

    def after(self, then: Callable[[], None]) -> None:
        """Run `then` once the checks passed: now, on this thread, when they
        have; else on theirs, when they do; never when they failed."""
        with self._lock:
            if not self._ended.is_set():
                self._then.append(then)
                return
        if self.failure is None:
            then()

    def forget_waiting(self) -> None:
        """At serve's end: what waits for the checks never runs (no spare or proxy started after it)."""
        with self._lock:
            self._then.clear()

    def refusal(self, tool: str) -> ToolResult | None:
        """For a call of `tool`: None once it may run (waiting for the checks
        when it runs a program), else the answer that refuses it."""
        if tool not in HELD:
            return None
        self.start()
        self._ended.wait()
        if self.failure is None:
            return None
        from .results import ToolResult

        from ..calls.setup import KeptFileUnfollowed

        lead = self.failure.lead if isinstance(self.failure, KeptFileUnfollowed) else CANNOT_START
        return ToolResult(f"Failed: {lead}: {self.failure}", is_error=True)

    def passed(self) -> bool:
        """Whether the checks passed, once they have ended (started if they were not, and waited for)."""
        self.start()
        self._ended.wait()
        return self.failure is None

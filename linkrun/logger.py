"""One voice per process, in one format, on stderr:

    [time ]lnk-link-run <process>: [warning: |error: ]<text>

`<process>` is named once at the process's start (`start`): serve, sweep,
supervise <id>, proxy, way-in, or the command a person ran. The time leads
only where stderr is a file that keeps the lines (a supervisor's `<id>.log`,
`proxy.log`); a client's log and a terminal are read as the lines come.

Quiet where a client shows stderr: serve, and the sweeps it starts, say
warnings and errors only, unless their stderr is a terminal; the rest say
what they do too. `LNK_LOG=info` (or `warning`, `error`) sets the level for
every process, over these defaults.

Not the standard `logging`: importing it costs serve's start about 3 ms
(traceback, string, weakref), more than the rest of this module does in a
day; a supervisor imports only what it needs. Stdlib only, nothing of ours.
"""

from __future__ import annotations

import _thread
import os
import stat
import sys
import time

ERROR, WARNING, INFO = 40, 30, 20
_LEVELS = {"error": ERROR, "warning": WARNING, "info": INFO}
_WORDS = {ERROR: "error: ", WARNING: "warning: ", INFO: ""}

_name = ""  # the process's name, once started
_shown = INFO  # the least level written
_timed = False  # a time before each line
_lock = _thread.allocate_lock()  # one line at a time, whole, from any thread (threading's Lock, without importing threading)


def start(name: str, *, quiet_for_a_client: bool = False) -> None:
    """Name this process's voice; with `quiet_for_a_client` (serve, its
    sweeps), only warnings and errors unless stderr is a terminal."""
    global _name, _shown, _timed
    _name = name
    quiet = quiet_for_a_client and not _is_terminal()
    _shown = _LEVELS.get(os.environ.get("LNK_LOG", ""), WARNING if quiet else INFO)
    try:
        _timed = stat.S_ISREG(os.fstat(sys.stderr.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):  # no stderr, or one with no descriptor (a test's capture)
        _timed = False


def error(text: str) -> None:
    """Something failed that should not have: a bug of ours, or a call or start that could not be served."""
    _say(ERROR, text)


def warning(text: str) -> None:
    """Something works less well than it should, and a person can mend it."""
    _say(WARNING, text)


def info(text: str) -> None:
    """What was done, with nothing to mend."""
    _say(INFO, text)


def _say(level: int, text: str) -> None:
    if level < _shown:
        return
    when = time.strftime("%Y-%m-%d %H:%M:%S%z ") if _timed else ""
    name = f"lnk-link-run {_name}" if _name else "lnk-link-run"
    line = f"{when}{name}: {_WORDS[level]}{text}\n"
    try:
        with _lock:
            sys.stderr.write(line)  # sys.stderr at each line: serve re-encodes it, tests capture it
            sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass  # no stderr, or its disk is full: what the line reports matters more than the line


def _is_terminal() -> bool:
    try:
        return os.isatty(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return False

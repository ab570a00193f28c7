"""How serve starts a supervisor, detached: the one command line that does it.

Apart from the supervisor itself, so that serve loads none of it to start one.
"""

from __future__ import annotations

import os
import sys


def script_argv(command_id: str, state: str) -> list[str]:
    """How serve starts a supervisor, detached: a shell that starts
    `python -I -S boot.py <folders> supervise <id> --state <dir>` in the
    background and exits at once.

    The shell is the intermediate the design's own fork makes: serve waits
    only for its exit (a millisecond, not an interpreter's start), and the
    supervisor it leaves is not serve's child. A background job's input
    would be /dev/null, so the lock (serve's stdin for it) is kept on fd 3
    and handed over explicitly. Without site, the interpreter starts in
    about half the time; boot.py puts our package and its libraries on
    sys.path. The command line ends with the seeds' words, each a whole
    argument, so that `ps` and a person find the supervisor by them.
    """
    python = [sys.executable, "-I", "-S", BOOT, folders(), "supervise", command_id, "--state", state]
    return ["/bin/sh", "-c", 'exec 3<&0; "$@" <&3 3<&- &', "sh", *python]


def folders() -> str:
    """Our package's and its libraries' folders, for boot.py's sys.path."""
    import importlib.util

    found: list[str] = []
    for name in ("linkrun", "orjson", "watchdog"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            folder = os.path.dirname(os.path.dirname(spec.origin))
            if folder not in found:
                found.append(folder)
    return os.pathsep.join(found)


# The script the supervisor starts with, beside this file.
BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot.py")

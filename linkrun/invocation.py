"""How the user types this install's command, for a message that tells them
to run it (`run lnk-link-run doctor`).

The bare name where their PATH finds this very install (pipx and uv tool
link it from a folder on the PATH), else its full path: the script beside
this interpreter, where pip, pipx and uv tool all put it. A clone's
tools/setup puts nothing on the PATH, and a message naming a command that
is not there is no help. A process's PATH stands for the user's: serve's is
the one its client gave it.
"""

from __future__ import annotations

import os
import sys

NAME = "lnk-link-run"


def typed(words: str) -> str:
    """`lnk-link-run <words>`, as the user can type it here."""
    return f"{command()} {words}"


def command() -> str:
    # sys.executable unresolved: a venv's bin/python is a link to the interpreter it was made from.
    ours = os.path.join(os.path.dirname(sys.executable), NAME)
    if not os.access(ours, os.X_OK):
        return f"{sys.executable} -m linkrun"  # a source tree run without an install
    import shutil  # here: modules on the way to serve's first answer import this one, and need not pay for it

    found = shutil.which(NAME)
    if found is not None and os.path.realpath(found) == os.path.realpath(ours):
        return NAME
    return ours

"""What serve's calls are made with, from its settings alone: the programs
this machine has of the allowlist and the sandbox each call runs in; what
execve can take; and the checks before serve's first call (up's, the
proxy's settings).

Light: serve answers `initialize` with instructions built on these before it
loads the owner of its calls (caller.py) and the tool layer.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .. import agent
from ..config import Serve
from ..errors import LinkRunError, Refused
from ..sandboxing.launch import Launch, Sandbox
from ..sandboxing.programs import Programs
from ..state import layout

TYPE_CHECKING = False
if TYPE_CHECKING:  # how a call's limits hold: the tool layer words it, as the owner hands it
    from ..sandboxing.fallback import Holding as Holding

# A launch adds a little after the arguments' check (a background command's
# gate: its interpreter, script and three words; bwrap's --info-fd):
# LAUNCH_RESERVE keeps room for it.
LAUNCH_RESERVE = 4096
PUT_IT_IN_INPUT = "put long text in input, or in a file of the files folder, and let the program read it"


class CallSetup:
    """The programs and the sandbox of serve's calls, built once from its settings."""

    def __init__(self, settings: Serve) -> None:
        # The agent's sandbox file, for a refusal's way to allow more: known where up started serve (--checks).
        sandbox_file = agent.locate(settings.checks).sandbox_file if settings.checks else None
        self.programs = Programs(settings.programs, settings.programs_path, settings.sandbox,
                                 settings.missing_programs, sandbox_file)
        self.offered = self.programs.offered()
        self.sandbox = Sandbox(tuple(settings.sandbox), settings.files, settings.write,
                               os.path.join(settings.state, layout.PROXY_FOLDER) if settings.proxy and settings.state else None,
                               settings.seccomp, settings.limits, longest=settings.timeout)


def exec_size(text: str) -> int:
    """Bytes as execve gets them (a lone surrogate counted as the 3 it would take)."""
    return len(text.encode("utf-8", "surrogatepass"))


# execve takes at least this much whatever the stack's limit (the kernel's ARG_MAX,
# the floor of its limit of a quarter of the stack).
KERNEL_ARG_MAX = 128 * 1024


def check_exec_size(launch: Launch) -> None:
    """Refuse what execve would fail with E2BIG (ARG_MAX), before anything runs."""
    command = launch.command()
    # Most calls: at most 4 bytes a character, bounded at C speed, and far
    # below what every kernel takes; the byte count only for a long one.
    if launch.env == {} and 4 * sum(map(len, command)) + 9 * len(command) <= KERNEL_ARG_MAX - LAUNCH_RESERVE:
        return
    if launch.env is None:  # serve's own, as bytes: what execve gets, with nothing to encode
        environment = sum(len(k) + len(v) + 10 for k, v in os.environb.items())
    else:
        environment = sum(exec_size(k) + exec_size(v) + 10 for k, v in launch.env.items())
    size = sum(exec_size(a) + 9 for a in command) + environment  # each its NUL and its pointer
    arg_max = os.sysconf("SC_ARG_MAX")
    if size > arg_max - LAUNCH_RESERVE:
        raise Refused(f"the program's arguments take {size} bytes with the sandbox's own and its environment, "
                      f"and Linux passes at most {arg_max} bytes to a program (ARG_MAX), "
                      f"{LAUNCH_RESERVE} of which are kept for the launch", PUT_IT_IN_INPUT)


def up_checks(root: str, fixed: Sequence[str], write: Sequence[str], seccomp: str | None) -> None:
    """What `up` checks of the agent's folder `root`: its kept sandbox file
    followed, its /etc view made current, then its sandbox started once
    (sandboxing/probe.py). Raises LinkRunError naming the fix."""
    from ..sandboxing import etcview, probe

    folder = agent.locate(root)
    kept_files_followed(folder)
    etcview.made_current(folder.state)
    probe.probe(fixed, folder, write, seccomp)


def kept_files_followed(folder: agent.AgentFolder) -> None:
    """The agent's kept sandbox file and spec, read as `up` reads them: one
    the user mended wrong had `up` start serve on the embedded defaults
    (up.py), and then nothing may run. Raises LinkRunError naming the fix."""
    from ..sandboxing import sandboxfile
    from .spec import read_toml, run_settings

    def again(problem: LinkRunError) -> str:
        return f"{problem.hint + '; then' if problem.hint else 'mend it, then'} start the agent again (its MCP client starts it)"

    try:
        sandboxfile.load(folder.sandbox_file)
    except LinkRunError as problem:
        raise KeptFileUnfollowed(problem.message, again(problem)) from None
    if os.path.exists(folder.spec_file):
        try:
            run_settings(read_toml(folder.spec_file, "spec"), folder.spec_file)
        except LinkRunError as problem:
            raise KeptSpecUnfollowed(problem.message, again(problem)) from None


class KeptFileUnfollowed(LinkRunError):
    """The agent's kept sandbox file cannot be followed: the machine is fine, the file is not."""

    lead = "the agent's sandbox file cannot be followed, so nothing runs"


class KeptSpecUnfollowed(KeptFileUnfollowed):
    """The agent's kept spec cannot be followed: its numbers would be the defaults', which the user did not ask for."""

    lead = "the agent's spec cannot be followed, so nothing runs"


def check_proxy_settings(state: str) -> None:
    """The agent's internet settings read once at serve's start: refused now, in one line, rather than at each call."""
    from ..network.internet import read_settings

    read_settings(state)

"""`lnk-link-run sandbox`: the sandbox of one call, built from a sandbox file
and run (or printed) from a shell, exactly as a call would run it, for
seeing and trying the sandbox itself. A command a person runs, so it sits
above the sandbox it builds: the argv builder (sandboxing/sandbox.py) stays
pure, and this is where the program is started, waited for and its
sandbox's init ended, with the agent's proxy when the file names hosts."""

from __future__ import annotations

import os
import shlex
import subprocess

from . import logger
from . import agent as agent_folder
from .config import split_flags
from .errors import LinkRunError, UsageError
from .network import internet as internet_
from .processes.group import kill_init
from .sandboxing.hostfacts import SYSTEM_PATH
from .sandboxing.launch import Sandbox, prepare, program_argv
from .sandboxing.sandbox import build, find_system, write_folders
from .sandboxing.sandboxfile import SandboxFile, load
from .state import layout


USAGE = "lnk-link-run sandbox [--file <sandbox.toml>] [--agent <dir>] [--print] -- <program> <args>"


def main(argv: list[str]) -> int:
    """Build the sandbox of one call and run the program in it (or print it).

    It does not check `[commands]` (serve does): it is for seeing and trying
    the sandbox itself. The program runs in the files folder, as a call does.
    """
    flags, command = split_flags(argv, {"--file", "--agent"}, {"--print"}, set())
    if not command and "--print" not in flags:
        raise UsageError("no program after --", f"usage: {USAGE}")
    sandbox = load(str(flags["--file"]) if "--file" in flags else None)
    environ = os.environ
    folder = agent_folder.create(str(flags.get("--agent") or agent_folder.default_root(environ)))
    fixed, _, _ = build(folder, sandbox, environ)
    program = list(command or [])
    if program and "/" not in program[0]:
        found = find_system(program[0])
        if found is None:
            raise UsageError(f"{program[0]!r} is not on the system PATH ({SYSTEM_PATH})",
                             "give an absolute path or a program this machine has")
        program[0] = found

    proxy_dir = os.path.join(folder.state, layout.PROXY_FOLDER) if sandbox.hosts else None
    from .sandboxing import seccomp

    box = Sandbox(tuple(fixed), folder.files, write_folders(sandbox), proxy_dir, seccomp.for_agent(folder.state))
    tail = program_argv(program[0], program[1:])
    if "--print" in flags:
        with prepare(box, tail, watch_init=False, git_check=False) as launch:
            print(shlex.join(launch.command()))
        return 0
    if sandbox.hosts:
        _internet_for(folder, sandbox)
    # Run and waited for, not exec'd: the git check (gitcheck.py) runs once the
    # sandbox ended. With the internet the agent's proxy is kept meanwhile.
    with prepare(box, tail, watch_init=bool(sandbox.hosts)) as launch, launch.spawning():
        process = subprocess.Popen(launch.command(), pass_fds=launch.fds, cwd=folder.files, env=launch.env)
        init = launch.started()
        while True:
            try:
                code = process.wait()
                break
            except KeyboardInterrupt:  # ^C reached the sandbox too (the terminal's group): wait for its end
                continue
        kill_init(init)
        if init is not None:
            os.close(init)
    for note in launch.git_notes:
        logger.warning(f"git check: {note}")
    return code if code >= 0 else 128 - code


def _internet_for(folder: agent_folder.AgentFolder, sandbox: SandboxFile) -> None:
    """As a call runs with [internet] hosts: the agent's proxy, given this
    file's hosts (the route and the way in `up` set are kept)."""
    try:
        _, route, way_in_port = internet_.read_settings(folder.state)
    except LinkRunError:
        route, way_in_port = None, None
    internet_.write_settings(folder.state, list(sandbox.hosts), route, way_in_port)
    internet_.Users(folder.state).ensure()

"""`lnk-link-run up`: what Link does at an agent's start (DESIGN.md §6).

It reads the sandbox file and the spec's `[tool.run]`, keeps the programs
this machine has, creates the agent's folder, builds the fixed part of the
sandbox argv once, and runs serve with everything (the product's defaults
live here, never in serve), which checks the sandbox as `doctor` does
(`--checks`) once it answered the handshake.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping

from . import logger
from . import agent as agent_folder
from . import doctor
from .state import filing, layout
from .network import internet
from .sandboxing import hostfacts, sandbox, sandboxfile, seccomp
from .address import parse_address
from .calls.setup import up_checks
from .config import Flags, WayInFlags, split_flags, way_in_flags
from .invocation import typed
from .calls.spec import RUN_KEYS, no_run_table, read_toml, run_settings
from .errors import LinkRunError, UsageError

USAGE = ("lnk-link-run up [--agent DIR] [--sandbox FILE] [--spec FILE] "
         "[--way-in ADDR --as ID [--keyring DIR] | --no-way-in] [--route PROXY]")


def _help() -> str:
    """`up --help`: what it is, and each flag with its default (the spec's from the embedded defaults)."""
    run = sandboxfile.defaults()["run"]
    spec = ", ".join(f"{key} {run[key]}" for key in RUN_KEYS)
    return f"""usage: {USAGE}

Start an agent's MCP server over stdio, as Link does at an agent's start. An
MCP client starts it and speaks to it on its input and output (docs/clients.md);
in a terminal it only waits. It makes the agent's folder when missing, checks
the sandbox as `lnk-link-run doctor` does, and serves: a `command` tool that
runs programs, each call in a sandbox of its own.

  --agent DIR      the agent's folder: Config/ (its sandbox file and spec),
                   Agent/, Home/, Files/ (the files folder calls run in),
                   State/ (default: $XDG_DATA_HOME/linkrun/agents/main, that
                   is ~/.local/share/linkrun/agents/main)
  --sandbox FILE   the sandbox file to use (what calls may run, write and
                   reach, and their limits), kept as Config/sandbox.toml
                   (default: the agent's Config/sandbox.toml, which the first
                   up writes with the embedded defaults)
  --spec FILE      a spec whose [tool.run] sets the numbers, kept as
                   Config/spec.toml (default: the agent's Config/spec.toml,
                   else {spec})
  --no-way-in      also offer background commands (start, list, read, write,
                   stop) to a client that takes no messages: their ends are
                   learnt with list and read (default: no background commands)
  --way-in ADDR    offer background commands, whose ends are told as messages
                   to Link's way in: http://127.0.0.1:<port>/<path> or
                   unix:<socket path>
  --as ID          the agent's id, which proves those messages (with --way-in)
  --keyring DIR    the folder of the agent's key, <DIR>/<ID>.key (with
                   --way-in; default: $LINK_KEYRING, else ~/.link/keyring)
  --route PROXY    send the connections the sandbox file's [internet] allows
                   through this proxy rather than directly (default: directly)
"""


_VALUED = {"--agent", "--sandbox", "--spec", "--way-in", "--as", "--keyring", "--route"}

HELP = _help()  # the embedded defaults are read here once; up reads them anyway


SANDBOX_FILE_HEADER = """\
# The agent's sandbox file: what its calls may run, write and reach, and their
# limits. The first `lnk-link-run up` wrote it with the defaults in force; edit
# it, and start the agent again. A section or key left out takes the embedded
# default; a list given replaces the default list (add to it, do not start a
# new one). `lnk-link-run doctor` says what holds on this machine.

"""


def default_sandbox_file() -> str:
    """The embedded default sandbox file as a sandbox file, with its comments:
    the `[sandbox.*]` sections of defaults.toml, the one place they are written."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "defaults.toml")) as f:
        text = f.read()
    start, end = text.index("[sandbox.commands]"), text.index("# The spec's [tool.run]")
    return SANDBOX_FILE_HEADER + text[start:end].replace("[sandbox.", "[").rstrip() + "\n"


def _keep(source: str, destination: str) -> None:
    """Copy the user's file into Config/ ("yours, kept for the agent"),
    whole or not at all."""
    if os.path.exists(destination) and os.path.samefile(source, destination):
        return
    with open(source, "rb") as f:
        data = f.read()
    filing.write_whole(destination, data, 0o644)


def _plan(argv: list[str], environ: Mapping[str, str]) -> tuple[list[str], Callable[[], None]]:
    """Everything `up` does but the exec: the argv it execs, and its checks
    still to run (the /etc view made current, then the sandbox's probe),
    which raise LinkRunError naming the fix. What the handshake says (the
    programs kept, the limits, the folders) is known without them."""
    flags, route, way_in = _check_flags(argv, environ)
    folder, settings, run, followed = _agent_files(flags, environ)
    keyring = way_in.keyring or os.path.abspath(agent_folder.default_keyring(environ))
    fixed, kept, host = sandbox.build(folder, settings, environ, keyring, etc_view=False)
    # The embedded list names more than most machines have; what the user added and the machine lacks is news.
    lacking = [program for program in kept.missing if program not in sandboxfile.defaults()["sandbox"]["commands"]["allow"]]
    if lacking:
        logger.warning(f"the sandbox file allows {', '.join(lacking)}, which this machine does not have: they are "
                       f"not offered; install them, or mend their names in {settings.source}")
    write = sandbox.write_folders(settings)
    if (unmade := sandbox.unmade_write_folders(folder.files, settings)) is not None:
        logger.warning(unmade)
    filter_path = seccomp.for_agent(folder.state)

    def check() -> None:  # a kept sandbox file mended wrong (not `followed`) fails here first
        up_checks(folder.root, fixed, write, filter_path)

    if followed:  # the defaults' hosts must not replace those a running proxy follows
        _prepare_internet(folder, settings, route, way_in)
    serve = [sys.executable, "-I", "-m", "linkrun", "serve", "--files", folder.files,
             "--programs-path", hostfacts.SYSTEM_PATH, "--timeout", run["--timeout"], "--output", run["--output"]]
    serve += [flag for program in kept.kept for flag in ("--program", program)]
    # So that a call of one is refused as missing here, not as not allowed.
    serve += [flag for program in kept.missing for flag in ("--missing-program", program)]
    serve += [flag for folder_ in write for flag in ("--write", folder_)]
    if filter_path:
        serve += ["--seccomp", filter_path]
    serve += ["--limits", sandbox.call_limits(settings, host).flag()]
    serve += ["--checks", folder.root]  # serve runs them after its first answer (front/checks.py)
    serve += _background_flags(folder, settings, run, way_in, "--no-way-in" in flags)
    return _in_scope(serve + ["--"] + fixed, folder), check


def _check_flags(argv: list[str], environ: Mapping[str, str]) -> tuple[Flags, str | None, WayInFlags]:
    """up's flags, each checked before anything is created: them, --route, the way in."""
    flags, rest = split_flags(argv, _VALUED, {"--no-way-in"}, set())
    if rest is not None:
        raise UsageError("up takes no program after --", f"usage: {USAGE}")
    route = None
    if "--route" in flags:
        try:
            route = internet.parse_route(flags["--route"])
        except LinkRunError as problem:
            raise UsageError(f"--route: {problem.message}", problem.hint) from None
    return flags, route, way_in_flags(flags, environ)


def _agent_files(flags: Flags, environ: Mapping[str, str]) -> tuple[agent_folder.AgentFolder, sandboxfile.SandboxFile,
                                                                   dict[str, str], bool]:
    """The agent's folder, made, with the sandbox file and the run settings it
    follows: the ones given (checked before anything is created or copied,
    then kept in Config/), else the ones kept, else the embedded defaults.

    A kept sandbox file or spec that the user edited into one that cannot be
    followed does not end `up` before its handshake, where its client would
    show a failed server and the reason only in its log: serve runs on the
    embedded defaults, and its checks (calls/setup.py reads the file again)
    fail with the reason, so every call that runs a program is refused with
    what is wrong and where, which the model reads and can tell the user.
    Before a person at a terminal, `up` ends with it, as before. The last
    value: whether the kept sandbox file is followed (not: the defaults'
    are; a spec mended wrong leaves it followed, and serve's checks refuse
    the calls all the same)."""
    sandbox_path, spec_path = flags.get("--sandbox"), flags.get("--spec")
    settings = sandboxfile.load(sandbox_path) if sandbox_path else None
    run = _run_of(spec_path) if spec_path else None

    folder = agent_folder.create(flags.get("--agent") or agent_folder.default_root(environ))
    followed = True
    if sandbox_path:
        _keep(sandbox_path, folder.sandbox_file)
    else:
        if not os.path.exists(folder.sandbox_file):
            filing.write_whole(folder.sandbox_file, default_sandbox_file().encode(), 0o644)
        try:
            settings = sandboxfile.load(folder.sandbox_file)
        except LinkRunError as problem:
            _say_served(problem)
            settings, followed = sandboxfile.load(None), False
    if spec_path:
        _keep(spec_path, folder.spec_file)
    elif os.path.exists(folder.spec_file):
        try:
            run = _run_of(folder.spec_file)
        except LinkRunError as problem:  # as the sandbox file's: said in the calls' answers (setup.py)
            _say_served(problem)
    assert settings is not None
    return folder, settings, run if run is not None else run_settings({}, "the embedded defaults"), followed


def _run_of(path: str) -> dict[str, str]:
    """A spec's serve flag values; one without [tool.run] is said to set none."""
    spec = read_toml(path, "spec")
    run = run_settings(spec, path)
    if (missing := no_run_table(spec, path)) is not None:
        logger.warning(str(missing))
    return run


def _say_served(problem: LinkRunError) -> None:
    """A kept file's problem, to be said through serve's answers (raised at once before a terminal)."""
    if os.isatty(0):
        raise problem
    logger.error(f"{problem}; serve starts on the embedded defaults, and refuses every call that runs a "
                 "program, saying why, until it is mended and the agent started again")


def _prepare_internet(folder: agent_folder.AgentFolder, settings: sandboxfile.SandboxFile, route: str | None,
                      way_in: WayInFlags) -> None:
    """The proxy's settings file (a --route without hosts is said to change nothing)."""
    if route and not settings.hosts:
        logger.warning("--route changes nothing: the sandbox file's [internet] names no hosts")
    if settings.hosts or os.path.exists(os.path.join(folder.state, layout.PROXY_SETTINGS)):
        # Also with no hosts: a proxy still kept by a background command follows the file.
        way_in_port = None
        if way_in.address:
            kind, where, _ = parse_address(way_in.address)  # checked: the way in's port, never reached
            way_in_port = where if kind == "http" else None
        internet.write_settings(folder.state, list(settings.hosts), route, way_in_port)


def _background_flags(folder: agent_folder.AgentFolder, settings: sandboxfile.SandboxFile, run: dict[str, str],
                      way_in: WayInFlags, no_way_in: bool) -> list[str]:
    """serve's state folder (for the kept output, background commands and the proxy), its proxy, the kept
    output's caps, and the background settings."""
    told = way_in.address is not None or no_way_in
    flags = ["--state", folder.state]  # always: a call's cut output is kept there
    if settings.hosts:
        flags += ["--proxy"]
    for flag in ("--keep-output", "--keep-for", "--keep-total"):
        flags += [flag, run[flag]]
    if not told:
        return flags
    if way_in.address is not None:
        flags += ["--way-in", way_in.address, "--as", str(way_in.agent), "--keyring", str(way_in.keyring)]
    else:
        flags += ["--no-way-in"]
    for flag in ("--background", "--background-timeout", "--background-output", "--background-keep",
                 "--background-per-day", "--hops"):
        flags += [flag, run[flag]]
    return flags


def _in_scope(serve: list[str], folder: agent_folder.AgentFolder) -> list[str]:
    """serve in a systemd scope of its own where one can be had: the per-agent limits."""
    works, _ = doctor.scope_works()
    if not works:
        return serve
    limits = sandboxfile.defaults()["limits"]
    # Delegate=yes: serve may make a cgroup for each call inside its scope.
    return [sandbox.find_system("systemd-run") or "systemd-run", "--user", "--scope", "--quiet", "--collect",
            "-p", "Delegate=yes",
            "-p", f"MemoryMax={limits['scope_memory']}", "-p", f"TasksMax={limits['scope_tasks']}",
            "--description", f"Link Run agent {os.path.basename(folder.root)}", "--"] + serve


def plan(argv: list[str], environ: Mapping[str, str]) -> list[str]:
    """serve's command line, once the sandbox was checked (as `doctor` does)."""
    command, check = _plan(argv, environ)
    check()
    return command


def main(argv: list[str]) -> int:
    command, _ = _plan(argv, os.environ)
    _say_to_a_terminal(argv, os.environ)
    serve_at = command.index("serve") if "serve" in command else -1
    if command[0] == sys.executable and serve_at == 4:
        # serve in this process: the same program an exec would start, without
        # paying a second interpreter start and its imports (about half of
        # up's time to its first answer). Either way serve runs the checks
        # (--checks) after it answered the handshake; the calls that run a
        # program wait for them (checks.py).
        from .front import server

        sys.stdout.flush()
        sys.stderr.flush()
        return server.main(command[serve_at + 1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)
    return 127  # not reached


def _say_to_a_terminal(argv: list[str], environ: Mapping[str, str]) -> None:
    """A person who started `up` in a terminal is told what it waits for; an MCP client's pipe gets nothing."""
    if not os.isatty(0):
        return
    flags, _ = split_flags(argv, _VALUED, {"--no-way-in"}, set())  # checked already by the plan
    folder = agent_folder.locate(flags.get("--agent") or agent_folder.default_root(environ))
    logger.info(f"this is an MCP server over stdio, waiting for a client on its input: start it from "
                f"an MCP client (docs/clients.md). The agent's folder is {folder.root}, its sandbox file "
                f"{folder.sandbox_file}; {typed('doctor')} checks the setup. Ctrl-D ends it.")

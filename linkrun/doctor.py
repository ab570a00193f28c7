"""`lnk-link-run doctor`: can the sandbox run here, and what to fix.

`up` runs `probe` (the agent's own sandbox, started once) before it execs
serve, so that nothing ever runs unsandboxed because the sandbox could not
start: it fails there, in one line naming the fix.
"""

from __future__ import annotations

import itertools
import os
import resource
import sys
from collections.abc import Generator, Iterator, Mapping
from typing import TYPE_CHECKING

from . import agent as agent_folder
from .sandboxing import hostfacts, sandbox, sandboxfile
from .config import CONTROLLERS, Limits, split_flags
from .errors import LinkRunError
from .invocation import typed
from .sandboxing.probe import TROUBLESHOOTING, probe
from .units import cores, describe_size

if TYPE_CHECKING:  # subprocess, shutil, tempfile where used: up imports this module, and its handshake needs none of them
    pass

Check = tuple[str, str, str]  # (level: ok, warn or FAIL; what; how to fix it)

def scope_works() -> tuple[bool, str]:
    """Whether `systemd-run --user --scope` can put a process in a scope here."""
    systemd_run = sandbox.find_system("systemd-run")
    if systemd_run is None:
        return False, "systemd-run is not installed"
    # No user bus, no user manager to ask: say so without a spawn that fails.
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    if not os.environ.get("DBUS_SESSION_BUS_ADDRESS") and not os.path.exists(os.path.join(runtime, "bus")):
        return False, "no user session bus (systemd --user is not running for this user)"
    import subprocess

    try:
        done = subprocess.run([systemd_run, "--user", "--scope", "--quiet", "--", "true"],
                              capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, str(error)
    if done.returncode == 0:
        return True, "systemd-run --user --scope works"
    return False, (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[0]


def checks(agent_root: str, sandbox_path: str | None, environ: Mapping[str, str]) -> Iterator[Check]:
    """Each check as (level, what, fix): level is ok, warn or FAIL. A FAIL
    ends the checks that would build on what failed."""
    folder = agent_folder.locate(agent_root)
    if sandbox_path is None and os.path.exists(folder.sandbox_file):
        sandbox_path = folder.sandbox_file
    settings = yield from _sandbox_file(sandbox_path)
    if settings is None:
        return
    yield from _spec_file(folder)
    if os.path.isdir(folder.files):
        unmade = sandbox.unmade_write_folders(folder.files, settings)
        # Once made (by a call, or by up's check of the sandbox), a mistyped name is an empty folder among them.
        yield ("warn", unmade, "") if unmade else ("ok", sandbox.write_folders_said(folder.files, settings), "")
    host = yield from _host_checks(settings)
    if host is None:
        return
    if os.path.isdir(folder.files):
        yield from _agent_checks(folder, settings, environ, host)
        return
    # Before the first `up`: every check `up` runs, in a scratch agent's
    # folder where the agent's will be made (the same file system), removed after.
    parent = _nearest_folder(folder.root)
    if not os.access(parent, os.W_OK | os.X_OK):
        yield "FAIL", f"the agent's folder {folder.root} cannot be made: {parent} may not be written", \
            "give up --agent a folder where you may write, such as under your home"
        return
    import shutil
    import tempfile

    scratch = tempfile.mkdtemp(prefix=".lnk-doctor-", dir=parent)
    missing = "has no Files/ yet" if os.path.isdir(folder.root) else "does not exist yet"
    yield "ok", f"the agent's folder {folder.root} {missing} ({typed('up')} makes it): the checks below ran " \
        f"in a scratch folder, {scratch}, removed after", ""
    try:
        yield from _agent_checks(agent_folder.create(scratch), settings, environ, host)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _nearest_folder(root: str) -> str:
    """The nearest folder above `root` that exists: where `up` would make it."""
    parent = os.path.dirname(os.path.abspath(root))
    while not os.path.isdir(parent) and parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
    return parent


def _agent_checks(folder: agent_folder.AgentFolder, settings: sandboxfile.SandboxFile, environ: Mapping[str, str],
                  host: hostfacts.Host) -> Iterator[Check]:
    """The checks that start the agent's sandbox, and what hangs on it."""
    kept = yield from _sandbox_starts(folder, settings, environ, host)
    if kept is None:
        return
    yield from _program_checks(kept)
    yield _fork_brake_check(host)
    works, why = scope_works()
    if works:
        yield "ok", "per-agent limits: serve runs in a systemd scope of its own", ""
    else:
        yield "warn", f"no per-agent memory and task limits: systemd-run --user --scope fails here ({why})", \
            ("each call keeps its own limits (below); for a cap on the agent as a whole, start it from a login "
             "session that runs systemd --user, or run loginctl enable-linger once (docs/troubleshooting.md, "
             "\"Per-call limits\")")
    yield from limit_checks(sandbox.call_limits(settings, host), works, why, _longest_call(folder))


def _longest_call(folder: agent_folder.AgentFolder) -> int:
    """The most seconds a call runs (the spec's timeout, else the default): the span of a cpu limit's rlimit."""
    from .config import parse_duration
    from .calls.spec import read_toml, run_settings

    source = folder.spec_file
    try:
        spec = read_toml(source, "spec") if os.path.exists(source) else {}
        return parse_duration("timeout", run_settings(spec, source)["--timeout"])
    except LinkRunError:
        return parse_duration("timeout", str(sandboxfile.defaults()["run"]["timeout"]))


def _sandbox_file(path: str | None) -> Generator[Check, None, sandboxfile.SandboxFile | None]:
    """The sandbox file, loaded; None once it failed."""
    try:
        settings = sandboxfile.load(path)
    except LinkRunError as error:
        yield "FAIL", f"the sandbox file: {error.message}", error.hint
        return None
    yield "ok", f"the sandbox file: {settings.source}", ""
    return settings


def _spec_file(folder: agent_folder.AgentFolder) -> Iterator[Check]:
    """The agent's spec, as `up` reads it: one it cannot follow ends `up` before its handshake."""
    from .calls.spec import no_run_table, read_toml, run_settings

    source = folder.spec_file
    if not os.path.exists(source):
        return  # none written: the embedded defaults
    try:
        spec = read_toml(source, "spec")
        run_settings(spec, source)
    except LinkRunError as error:
        yield "FAIL", f"the spec: {error.message}", \
            f"{error.hint + '; ' if error.hint else ''}mend it, then start the agent again: until then its server " \
            "refuses every call that runs a program, saying why"
        return
    if (missing := no_run_table(spec, source)) is not None:
        yield "warn", missing.message, missing.hint
        return
    yield "ok", f"the spec: {source}", ""


def _host_checks(settings: sandboxfile.SandboxFile) -> Generator[Check, None, hostfacts.Host | None]:
    """This machine's bubblewrap and what the sandbox file asks of it; None once bubblewrap failed."""
    try:
        host = sandbox.host_facts()
    except LinkRunError as error:
        yield "FAIL", error.message, error.hint
        return None
    yield "ok", f"bubblewrap: {host.bwrap}; prlimit: {host.prlimit}", ""
    if settings.hosts:
        yield "ok", f"the internet, through the agent's proxy: {', '.join(settings.hosts)}", ""
    if host.disable_userns:
        yield "ok", "bubblewrap has --disable-userns: no program makes a user namespace of its own", ""
    else:
        yield "warn", "this bubblewrap has no --disable-userns (it came in 0.8.0)", "update bubblewrap"
    return host


def _sandbox_starts(folder: agent_folder.AgentFolder, settings: sandboxfile.SandboxFile, environ: Mapping[str, str],
                    host: hostfacts.Host) -> Generator[Check, None, sandbox.ProgramsHere | None]:
    """The agent's own sandbox, started once; the programs it keeps, or None once it failed."""
    from .sandboxing import seccomp

    try:
        filter_path = seccomp.for_agent(folder.state)
        if filter_path is None:
            yield "warn", f"this machine type ({os.uname().machine}) has no syscall filter here: the sandbox " \
                "runs without one", "see docs/security.md (the filter is built for x86_64 and aarch64)"
        fixed, kept, _ = sandbox.build(folder, settings, environ, host=host)
        probe(fixed, folder, sandbox.write_folders(settings), filter_path)
    except LinkRunError as error:
        yield "FAIL", error.message, error.hint
        return None
    yield "ok", "the sandbox starts, in the files folder, which it cannot write but for its write folders", ""
    yield "ok", "inside, the kernel's settings (/proc) and /dev are read-only, and no process has the " \
        "caller's environment", ""
    if filter_path:
        yield "ok", "the syscall filter is loaded inside (io_uring, keys, bpf, the mount API, new namespaces " \
            "and terminal injection are refused)", ""
    return kept


def _program_checks(kept: sandbox.ProgramsHere) -> Iterator[Check]:
    yield "ok", f"programs offered: {', '.join(kept.kept) or 'none'}", ""
    if kept.missing:
        yield "warn", f"not on this machine, so not offered: {', '.join(kept.missing)}", "install them if the agent needs them"
    for name, where in kept.hidden:
        yield "warn", f"{name} resolves to {where}, which the sandbox does not show, so it is not offered", \
            f"list {where} in [commands] allow to show its folder"


def _fork_brake_check(host: hostfacts.Host) -> Check:
    """The brake is the uid's count plus a margin, cut to the hard limit: only
    a hard limit below that is near (the brake itself is never a hard limit,
    and doctor's own processes count)."""
    margin = int(sandboxfile.defaults()["limits"]["nproc_margin"])
    if os.getuid() == 0:
        return "warn", f"running as root: the fork-bomb brake (--nproc {host.nproc}) binds nothing for root", \
            "run the agent as an ordinary user"
    count, hard = hostfacts.count_tasks(os.getuid()), hostfacts.hard_limit(resource.RLIMIT_NPROC)
    if hard is not None and hard < count + margin:
        return "warn", f"your user runs {count} tasks, near its hard limit of {hard}: " \
            "a call may fail to start processes", "raise the hard limit on processes (ulimit -Hu) or run fewer"
    return "ok", f"the fork-bomb brake: --nproc {host.nproc} (your user's tasks when it was read + {margin})", ""


def limit_checks(limits: Limits, scope_works_here: bool, scope_why: str, longest: int | None = None) -> Iterator[Check]:
    """Which per-call limits hold here and how: each call in a cgroup of its own,
    else an rlimit inside its sandbox (fallback.py), and why the others do not."""
    from .sandboxing import cgroups, fallback  # here: up imports this module, and its start needs none of it

    place = cgroups.find()
    held = fallback.holding(limits, place, longest)
    described = {"memory": f"memory {describe_size(limits.memory or 0)}", "tasks": f"tasks {limits.tasks}", "cpu": f"cpu {limits.cpu}%"}
    if held.by_cgroup:
        yield "ok", f"per-call limits hold through cgroup v{place.version}: " + \
            ", ".join(described[name] for name in held.by_cgroup), ""
    rest = held.by_rlimit + held.not_held
    if not rest:
        return
    if scope_works_here and place.version != 1:
        yield "ok", "per-call limits: " + ", ".join(described[name] for name in rest) + \
            " should hold in the delegated scope up runs serve in (systemd-run --user --scope -p Delegate=yes)", ""
        return
    fix = _limit_fix(scope_why)
    for name in rest:
        why = place.missing[CONTROLLERS[name]]
        if name == "memory" and name in held.by_rlimit:
            yield "warn", f"per-call memory limit {describe_size(held.at_most('memory'))} holds for each process " \
                f"alone, not for the call: an rlimit (RLIMIT_DATA) past which an allocation fails, as {why}", fix
        elif name == "tasks" and name in held.by_rlimit:
            yield "ok", f"per-call tasks limit {held.at_most('tasks')} holds for the call: an rlimit (RLIMIT_NPROC) that " \
                f"counts the call's own user namespace, as {why}", ""
        elif name == "cpu" and name in held.by_rlimit:
            yield "warn", f"per-call cpu limit {cores(limits.cpu or 0)} holds as CPU time for each process: " \
                f"{held.cpu_seconds} s (RLIMIT_CPU), not as a cap, as {why}", fix
        else:
            unheld = "RLIMIT_NPROC binds nothing for root" if name == "tasks" and os.geteuid() == 0 else why
            yield "warn", f"no per-call {name} limit: {unheld}", fix


def _limit_fix(scope_why: str) -> str:
    if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"):
        return ("this is a container: run the agent on the host, or give the container a cgroup v2 group "
                "of its own that it may write (such as docker run --cgroupns=private with a delegated cgroup)")
    if os.getuid() == 0:
        return "mount the missing cgroup controller, or boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1)"
    return (f"no systemd user session to delegate a cgroup to this user ({scope_why}): log in through a "
            "session that starts systemd --user (or run loginctl enable-linger), so that up runs serve in a "
            f"delegated scope; see 'Per-call limits' in {TROUBLESHOOTING}")


def record_checks(agent_root: str) -> Iterator[Check]:
    """Background records that are not whole: set aside by a sweep, or not yet."""
    from .state import layout, records

    folder = agent_folder.locate(agent_root)
    background = os.path.join(folder.files, layout.BACKGROUND)
    aside = os.path.join(folder.state, layout.BAD)
    try:
        set_aside = sorted(name.removesuffix(layout.RECORD) for name in os.listdir(aside) if name.endswith(layout.RECORD))
    except OSError:
        set_aside = []
    for command_id in set_aside:
        output = os.path.join(background, layout.output_name(command_id))
        also = f" and its output {output}" if os.path.exists(output) else ""
        yield "warn", f"background command {command_id}: its record was not whole and is set aside in {aside}", \
            f"look at {os.path.join(aside, command_id + layout.RECORD)}{also}, then delete them"
    for command_id in records.ids(folder.state):
        try:
            records.load_strict(folder.state, command_id)
        except records.BadRecord as bad:
            yield "warn", f"background command {command_id}: its record is not whole ({bad})", \
                f"run {typed('sweep')} {folder.state} to set it aside"


def main(argv: list[str]) -> int:
    flags, _ = split_flags(argv, {"--agent", "--sandbox"}, set(), set())
    environ = os.environ
    root = str(flags.get("--agent") or agent_folder.default_root(environ))
    failed = False
    found = itertools.chain(checks(root, flags.get("--sandbox"), environ), record_checks(root))
    for level, what, fix in found:
        failed |= level == "FAIL"
        print(f"{level:<4} {what}" + (f"\n     → {fix}" if fix else ""))
    sys.stdout.flush()
    return 1 if failed else 0

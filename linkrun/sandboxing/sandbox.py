"""The sandbox file → the bubblewrap argv (DESIGN.md §6).

`fixed_argv` is a pure function of its inputs (the agent's folder, the
sandbox file, the facts of this machine gathered once by `host_facts`), so
tests read it. The per-call part (the write folders, opened through
descriptors) is added by `launch.prepare` at each call, in serve and in the
supervisor; `lnk-link-run sandbox` (sandbox_command.py) adds it too, so that
it runs exactly what a call would. `/etc` is bound as one prepared view of its allow list
(etcview.py), made here (`build`) and refreshed by each launch.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from .. import agent as agent_folder
from . import etcview
from ..network import internet as internet_
from ..config import Limits
from ..config import parse_size
from ..errors import LinkRunError
from .hostfacts import ROOT_FOLDERS, SYSTEM_PATH, Host, bwrap_has, entries, hard_limit, hidden_keys, memory_total, nproc_limit
from .programs import which
from .sandboxfile import SandboxFile, defaults


# What every sandbox has of its own: a program's folder may lie below one, never be or hold one.
SANDBOX_OWN = ("/tmp", "/var/tmp", "/dev", "/proc", "/run/lnk")
def call_limits(settings: SandboxFile, host: Host) -> Limits:
    """The sandbox file's per-call limits, resolved against this machine."""
    memory = settings.memory
    if memory.endswith("%"):
        size = host.memory_total * int(memory[:-1]) // 100
    else:
        size = parse_size("[limits] memory", memory)
    spare = int(defaults()["limits"]["cpu_spare_cores"])
    cpu = settings.cpu if settings.cpu is not None else max(1, host.cpus - spare) * 100
    return Limits(memory=size, tasks=settings.tasks, cpu=cpu)


def find_system(name: str) -> str | None:
    return which(name, SYSTEM_PATH)


def host_facts() -> Host:
    """Read this machine. Raises LinkRunError when bubblewrap or prlimit is missing."""
    bwrap = find_system("bwrap")
    if bwrap is None:
        raise LinkRunError(
            "bubblewrap (bwrap) is not installed, and nothing runs without the sandbox",
            "install it (apt install bubblewrap, dnf install bubblewrap, pacman -S bubblewrap) and start again")
    prlimit = find_system("prlimit")
    if prlimit is None:
        raise LinkRunError("prlimit is not installed, and the sandbox's limits need it",
                           "install util-linux (apt install util-linux) and start again")
    return Host(
        bwrap=bwrap,
        prlimit=prlimit,
        disable_userns=bwrap_has(bwrap, "--disable-userns"),
        root=tuple(entries("/", ROOT_FOLDERS)),
        nproc=nproc_limit(int(defaults()["limits"]["nproc_margin"])),
        fsize_max=hard_limit(resource.RLIMIT_FSIZE),
        memory_total=memory_total(),
        cpus=len(os.sched_getaffinity(0)),
    )


def system_folders(host: Host) -> list[str]:
    """The host folders the sandbox shows read-only as they are (and /etc's
    allowed folders, copied into its view)."""
    etc = [f"{etcview.ETC}/{name}" for name in sorted(os.listdir(etcview.ETC)) if etcview.wanted(name)]
    return ["/usr"] + [path for path, target in host.root if target is None] + [
        path for path in etc if os.path.isdir(path) and not os.path.islink(path)]


def inside(path: str, folder: str) -> bool:
    path, folder = os.path.normpath(path), os.path.normpath(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


class ProgramsHere(NamedTuple):
    """The `[commands] allow` entries this machine has and the sandbox shows."""

    kept: tuple[str, ...]  # as given: bare names, absolute paths, or *
    missing: tuple[str, ...]  # not found on the system PATH (or not an executable file)
    hidden: tuple[tuple[str, str], ...]  # (name, where it resolves) outside the bound folders
    folders: tuple[str, ...]  # folders of allowed absolute programs, to bind read-only


def programs(allow: Sequence[str], host: Host, folder: agent_folder.AgentFolder) -> ProgramsHere:
    kept: list[str] = []
    missing: list[str] = []
    hidden: list[tuple[str, str]] = []
    folders: list[str] = []
    shown = system_folders(host) + [folder.files, folder.agent, folder.home]
    for program in allow:
        if program == "*":
            kept.append(program)
            continue
        if program.startswith("/"):
            if not (os.path.isfile(program) and os.access(program, os.X_OK)):
                missing.append(program)
                continue
            kept.append(program)
            for place in (os.path.dirname(program), os.path.dirname(os.path.realpath(program))):
                if not any(inside(place, s) for s in shown + folders):
                    folders.append(place)
            continue
        found = find_system(program)
        if found is None:
            missing.append(program)
        elif not any(inside(os.path.realpath(found), s) for s in shown):
            hidden.append((program, os.path.realpath(found)))
        else:
            kept.append(program)
    return ProgramsHere(tuple(kept), tuple(missing), tuple(hidden), tuple(folders))


def environment(folder: agent_folder.AgentFolder, internet: bool = False) -> list[tuple[str, str]]:
    """The sandbox's whole environment: nothing of the caller's. Caches go
    under work/.cache, the one place a program writes that outlives it. With
    [internet] hosts, the proxy variables name the proxy's listener on the sandbox's own loopback (§6)."""
    cache = f"{folder.files}/work/.cache"
    return [
        ("PATH", SYSTEM_PATH), ("HOME", folder.home), ("LANG", "C.UTF-8"), ("TMPDIR", "/tmp"),
        ("NO_COLOR", "1"), ("TERM", "dumb"), ("PAGER", "cat"), ("GIT_TERMINAL_PROMPT", "0"),
        # What Python prints reaches the output as it prints it: a line waited for, a call cut by its timeout.
        ("PYTHONUNBUFFERED", "1"),
        # Node's REPL keeps no history file: the home it would write is read-only (it said so at each start).
        ("NODE_REPL_HISTORY", ""),
        ("XDG_CACHE_HOME", cache), ("PIP_CACHE_DIR", f"{cache}/pip"),
        ("npm_config_cache", f"{cache}/npm"), ("CARGO_HOME", f"{cache}/cargo"),
        ("GOCACHE", f"{cache}/go-build"), ("GOPATH", f"{cache}/go"),
    ] + (list(internet_.VARIABLES) if internet else list(NO_RETRIES))


# Without the internet a package manager's retries only wait: npm's for 74 s before it failed, pip's for 8.
# pip keeps one, at once: its warning is where it says why (without it, only "no version found").
NO_RETRIES = (("PIP_RETRIES", "1"), ("npm_config_fetch_retries", "0"), ("CARGO_NET_RETRY", "0"))


def fixed_argv(folder: agent_folder.AgentFolder, sandbox: SandboxFile, host: Host,
               program_folders: Sequence[str], protected: Sequence[tuple[str, str]]) -> list[str]:
    """The fixed part of the sandbox argv: what serve runs before the per-call
    part, the `--` and the program. Pure: it reads nothing, spawns nothing.

    Raises LinkRunError when a bind would contain or lie inside a protected
    place (agent.protected).
    """
    file_size = sandbox.file_size if host.fsize_max is None else min(sandbox.file_size, host.fsize_max)
    argv = [host.prlimit, "--core=0", f"--fsize={file_size}", f"--nproc={host.nproc}", "--",
            host.bwrap, "--unshare-user"]
    if host.disable_userns:
        argv.append("--disable-userns")
    # As root, bwrap keeps every capability in the sandbox's user namespace,
    # enough to remount a read-only bind writable: drop them all.
    argv += ["--cap-drop", "ALL", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
             "--unshare-cgroup", "--unshare-net", "--die-with-parent", "--new-session"]
    binds = ["/usr"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for path, target in host.root:
        if target is None:
            binds.append(path)
            argv += ["--ro-bind", path, path]
        else:
            argv += ["--symlink", target, path]
    # /etc's allowed entries, copied into one folder (etcview.py): a launch
    # binds the view it pins by a descriptor in place of this path.
    argv += ["--ro-bind", etcview.link_of(folder.state), etcview.ETC]
    tmp = str(sandbox.tmp_size)
    # /proc read-only whole, by one remount: as root a sandbox runs as the
    # host's uid 0, and much of /proc checks only that uid and the mode bits
    # (/proc/sys/kernel/core_pattern written inside runs a program on the
    # host as real root). A bind per kernel folder cost a mount each; a
    # process's own files (its mem, its oom_score_adj) are read-only too. Its lists of keys show none.
    argv += ["--proc", "/proc", "--remount-ro", "/proc", *hidden_keys(host)]
    # /dev is a tmpfs of bwrap's without a size: read-only once its nodes are
    # made, so nothing fills memory there (its own /dev/shm keeps a size).
    argv += ["--dev", "/dev", "--size", tmp, "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
             "--size", tmp, "--tmpfs", "/tmp", "--symlink", "/tmp", "/var/tmp"]
    # After /tmp, so that a program's or the agent's folder under /tmp is found inside it.
    for path in program_folders:
        own = next((place for place in SANDBOX_OWN if inside(place, path)), None)
        if own is not None:
            raise LinkRunError(f"[commands] allow has a program in {path}, which would cover the sandbox's own {own}",
                               "move the program to a folder of its own (such as /opt/tools/bin) and allow it there")
        binds.append(path)
        argv += ["--ro-bind", path, path]
    for path in (folder.agent, folder.home, folder.files):
        binds.append(path)
        argv += ["--ro-bind", path, path]
    # bwrap's own root is a tmpfs without a size: read-only, so nothing can
    # fill memory there. Later binds mount on folders that already exist.
    argv += ["--remount-ro", "/", "--clearenv"]
    for name, value in environment(folder, bool(sandbox.hosts)):
        argv += ["--setenv", name, value]
    check_binds(binds, protected)
    return argv


def check_binds(binds: Sequence[str], protected: Sequence[tuple[str, str]]) -> None:
    for path in binds:
        for place, what in protected:
            if inside(path, place) or inside(place, path):
                relation = "lies inside" if inside(path, place) else "contains"
                raise LinkRunError(
                    f"the sandbox would show {path}, which {relation} {what} ({place})",
                    "move the agent's folder or the program elsewhere: that place is never shown to a sandbox")


def build(folder: agent_folder.AgentFolder, sandbox: SandboxFile, environ: Mapping[str, str],
          keyring: str | None = None, host: Host | None = None, etc_view: bool = True) -> tuple[list[str], ProgramsHere, Host]:
    """What `up`, `doctor` and `sandbox` share: this machine's facts (read here unless given), the programs
    kept, the fixed argv, and (unless not `etc_view`: up's checks do it) the /etc view it binds made current."""
    host = host if host is not None else host_facts()
    if etc_view:
        etcview.made_current(folder.state)
    kept = programs(sandbox.allow, host, folder)
    places = agent_folder.protected(folder, keyring or agent_folder.default_keyring(environ), environ)
    return fixed_argv(folder, sandbox, host, kept.folders, places), kept, host


def write_folders(sandbox: SandboxFile) -> tuple[str, ...]:
    """serve's --write: work/ and the [files] write entries."""
    return tuple(dict.fromkeys(("work",) + sandbox.write))


def write_folders_said(files: str, sandbox: SandboxFile) -> str:
    """The folders calls may write, each empty one said so: a mistyped name shows there once a call made it."""
    def said(name: str) -> str:
        path = os.path.join(files, name)
        return f"{name}/ (empty)" if os.path.isdir(path) and not os.listdir(path) else f"{name}/"

    return "the folders calls may write: " + ", ".join(said(name) for name in write_folders(sandbox))


def unmade_write_folders(files: str, sandbox: SandboxFile) -> str | None:
    """The [files] write folders the files folder lacks, said (a call makes them, empty: a typo is a new folder); else None."""
    unmade = [f"{name}/" for name in sandbox.write if not os.path.isdir(os.path.join(files, name))]
    if not unmade:
        return None
    return (f"[files] write names {', '.join(unmade)}, which the files folder {files} lacks: each call makes "
            f"{'it' if len(unmade) == 1 else 'them'}, empty; if a name is mistyped, mend it in {sandbox.source}")

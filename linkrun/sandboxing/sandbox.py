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

import functools
import os
import re
import resource
import tomllib
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, TypeVar

from .. import agent as agent_folder
from . import etcview
from ..network import internet as internet_
from ..config import Limits
from ..config import parse_size
from ..errors import LinkRunError, UsageError
from .hostfacts import ROOT_FOLDERS, SYSTEM_PATH, Host, bwrap_has, entries, hard_limit, hidden_keys, memory_total, nproc_limit
from .programs import which

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# What every sandbox has of its own: a program's folder may lie below one, never be or hold one.
SANDBOX_OWN = ("/tmp", "/var/tmp", "/dev", "/proc", "/run/lnk")
RESERVED = ("chats", "background")  # of the files folder: never writable


@functools.cache
def defaults() -> dict[str, Any]:
    """The embedded defaults (defaults.toml in the package's folder)."""
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "defaults.toml"), "rb") as f:
        return tomllib.load(f)


class SandboxFile(NamedTuple):
    """A sandbox file, checked. `source` names it in messages."""

    allow: tuple[str, ...]
    write: tuple[str, ...]
    hosts: tuple[str, ...]
    tmp_size: int
    file_size: int
    source: str
    memory: str = "25%"  # per call: a size ("4G") or a share of this machine's memory ("25%")
    tasks: int = 1024  # per call
    cpu: int | None = None  # per call, in percent of one core; None: every core but the spare ones


T = TypeVar("T")
KEYS = {"commands": {"allow"}, "files": {"write"}, "internet": {"hosts"}, "limits": {"tmp", "file", "memory", "tasks", "cpu"}}


def parse(data: Mapping[str, Any], source: str) -> SandboxFile:
    """A parsed TOML table → SandboxFile. A section left out takes the
    embedded default (so a file with only `[files]` keeps the default
    commands); an unknown section or key is refused, as a typo would
    otherwise silently grant or refuse something. Every mistake is said at
    once, so that one mending does (TOML that does not parse stops first)."""
    base = defaults()["sandbox"]
    problems: list[LinkRunError] = []

    def checked(check: Callable[[], T], instead: T) -> T:
        try:
            return check()
        except LinkRunError as problem:
            problems.append(problem)
            return instead

    for section, table in data.items():
        if section not in KEYS or not isinstance(table, Mapping):
            problems.append(LinkRunError(f"{source}: unknown section [{section}]",
                                         "a sandbox file has [commands], [files], [internet] and [limits]"))
            continue
        problems += [LinkRunError(f"{source}: unknown key {key!r} in [{section}]",
                                  f"[{section}] takes {', '.join(sorted(KEYS[section]))}")
                     for key in table if key not in KEYS[section]]

    def value(section: str, key: str) -> object:
        return _table(data, section).get(key, base[section][key])

    settings = SandboxFile(
        allow=checked(lambda: _programs(_strings(value("commands", "allow"), source, "[commands] allow"), source), ()),
        write=checked(lambda: check_write(_strings(value("files", "write"), source, "[files] write"), source), ()),
        hosts=checked(lambda: _hosts(_strings(value("internet", "hosts"), source, "[internet] hosts"), source), ()),
        tmp_size=checked(lambda: _size(value("limits", "tmp"), source, "[limits] tmp"), 0),
        file_size=checked(lambda: _size(value("limits", "file"), source, "[limits] file"), 0),
        source=source,
        memory=checked(lambda: _memory(value("limits", "memory"), source), ""),
        tasks=checked(lambda: _tasks(value("limits", "tasks"), source), 0),
        cpu=checked(lambda: _cpu(_table(data, "limits").get("cpu", base["limits"].get("cpu")), source), None),
    )
    if len(problems) == 1:
        raise problems[0]
    if problems:
        said = "; and ".join(f"{p.message.removeprefix(source + ': ')} ({p.hint})" if p.hint else
                             p.message.removeprefix(source + ": ") for p in problems)
        raise LinkRunError(f"{source} has {len(problems)} mistakes: {said}", "mend each")
    return settings


def _table(data: Mapping[str, Any], section: str) -> Mapping[str, Any]:
    """A section as given, or none (one that is no table is said by parse)."""
    table = data.get(section, {})
    return table if isinstance(table, Mapping) else {}


def _programs(allow: tuple[str, ...], source: str) -> tuple[str, ...]:
    for program in allow:
        if program != "*" and ("/" in program and not program.startswith("/")
                               or any(c in program for c in "=\0\n") or not program):
            raise LinkRunError(f"{source}: [commands] allow has {program!r}",
                               "name a program (sh), give its absolute path (/opt/x/bin/y), or *")
    return allow


def _hosts(hosts: tuple[str, ...], source: str) -> tuple[str, ...]:
    for host in hosts:
        match = re.fullmatch(r"(\*|(\*\.)?[A-Za-z0-9.-]+)(:(\d{1,5}))?", host)
        if not match or match[4] and not 0 < int(match[4]) < 65536 or match[1] == "*" and match[3]:
            port = host.rpartition(":")[2]  # where a new user's mistake shows: a scheme, a path, a port
            why = (", with a scheme: a host is its name alone" if "://" in host else
                   ", with a path: a host is its name alone" if "/" in host else
                   ", a port for *, which admits 80 and 443 alone" if host.startswith("*:") else
                   ", an IPv6 address, which cannot be named" if "[" in host or host.count(":") > 1 else
                   f", whose port {port} is not one (1 to 65535)" if port.isdigit() and not 0 < int(port) < 65536
                   else "")
            raise LinkRunError(f"{source}: [internet] hosts has {host!r}{why}",
                               'write example.org, *.example.net, example.com:8443 or "*"')
    return hosts


MIN_TASKS = 16  # the sandbox itself takes a few: the joining shell, bwrap, its init


def _memory(value: object, source: str) -> str:
    """`[limits] memory`: a size, or a share of this machine's memory ("25%"); a bad one names both forms."""
    both = 'write a size such as "4G", or a share from "1%" to "100%"'
    if isinstance(value, str) and value.endswith("%"):
        if value[:-1].isdigit() and 0 < int(value[:-1]) <= 100:
            return value
        raise LinkRunError(f"{source}: [limits] memory {value!r} is not a share of the memory", both)
    try:
        _size(value, source, "[limits] memory")
    except LinkRunError as error:
        raise LinkRunError(error.message, both) from None
    return str(value)


def _tasks(value: object, source: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= MIN_TASKS:
        return value
    raise LinkRunError(f"{source}: [limits] tasks = {value!r} is not a whole number of at least {MIN_TASKS}",
                       "write the most processes and threads a call may have at once, such as 1024")


def _cpu(value: object, source: str) -> int | None:
    """`[limits] cpu`: a cap in percent of one core, as top counts ("200%": two cores' worth)."""
    if value is None:
        return None
    if isinstance(value, str) and value.endswith("%") and value[:-1].isdigit() and int(value[:-1]) > 0:
        return int(value[:-1])
    raise LinkRunError(f"{source}: [limits] cpu = {value!r} is not a percentage of one core",
                       'write such as "200%" (two cores\' worth) or "50%" (half of one)')


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


def load(path: str | None) -> SandboxFile:
    """The sandbox file at `path`, or the embedded defaults for None."""
    if path is None:
        return parse({}, "the embedded default sandbox file")
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as error:
        raise LinkRunError(f"cannot read the sandbox file {path}: {error.strerror}",
                           "give a readable file") from None
    except tomllib.TOMLDecodeError as error:
        raise LinkRunError(f"the sandbox file {path} is not valid TOML: {error}",
                           "fix it: README's \"Use it from an MCP client\" shows the file's form, and the first "
                           "up writes the defaults in force, commented, into the agent's Config/sandbox.toml") from None
    return parse(data, path)


def check_write(entries: Sequence[str], source: str) -> tuple[str, ...]:
    """`[files] write` entries: relative, no `.`, `..` or empty component;
    not, inside or containing chats/ or background/; not nesting with another
    entry (one inside work/ is allowed: work/ is always writable)."""
    for entry in entries:
        parts = entry.split("/")
        if entry.startswith("/") or "\0" in entry or any(p in ("", ".", "..") for p in parts):
            raise LinkRunError(f"{source}: [files] write has {entry!r}",
                               "give a folder of the files folder, relative, with no '.', '..' "
                               "or empty component, such as data or out/reports")
        if parts[0] in RESERVED:
            raise LinkRunError(f"{source}: [files] write has {entry!r}, in {parts[0]}/",
                               "chats/ and background/ are never writable: choose another folder")
    for a in entries:
        for b in entries:
            if a != b and b.startswith(a + "/") and a != "work":
                raise LinkRunError(f"{source}: [files] write has {b!r} inside {a!r}",
                                   "give one of them")
    return tuple(dict.fromkeys(entries))


def _strings(value: object, source: str, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise LinkRunError(f"{source}: {what} is not a list of strings", f'write {what.split()[-1]} = ["..."]')
    return tuple(value)


def _size(value: object, source: str, what: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    try:
        return parse_size(what, str(value))
    except UsageError as error:
        raise LinkRunError(f"{source}: {error.message}", error.hint) from None


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

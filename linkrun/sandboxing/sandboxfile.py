"""The sandbox file, read and checked (DESIGN.md §6), and the embedded
defaults it and the spec fall back on (defaults.toml). What a file says is
turned into bubblewrap's argv by sandbox.py."""

from __future__ import annotations

import functools
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, TypeVar

from ..config import parse_size
from ..errors import LinkRunError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

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

"""Flags → frozen settings. Parses and checks; does nothing else.

serve has no number or grant of its own: every value comes from its command
line (the product's defaults live in `up`), and a missing or bad one is named
in one line (UsageError, exit 2).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import NamedTuple

from .address import AGENT_ID, parse_address
from .agent import default_keyring
from .errors import LinkRunError, UsageError

# A call's limits → the cgroup controller that enforces each (cgroups.py).
CONTROLLERS = {"memory": "memory", "tasks": "pids", "cpu": "cpu"}

# Matched whole (fullmatch): `$` would let a trailing newline through.
_DURATION = re.compile(r"(\d+)([smhd]?)")
_SIZE = re.compile(r"(\d+)([KMG]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_duration(flag: str, text: str) -> int:
    """`90`, `90s`, `2m`, `1h`, `1d` → seconds (above 0)."""
    match = _DURATION.fullmatch(text)
    if match and int(match.group(1)) == 0:
        raise UsageError(f"{flag} {text!r} is no time at all", "give at least 1s")
    if not match:
        raise UsageError(f"{flag} {text!r} is not a duration", "write it as 90, 90s, 2m, 1h or 1d")
    return int(match.group(1)) * _UNITS[match.group(2)]


def parse_size(flag: str, text: str) -> int:
    """`16384`, `16K`, `16M` (K = 1024) → bytes (above 0)."""
    match = _SIZE.fullmatch(text)
    if match and int(match.group(1)) == 0:
        raise UsageError(f"{flag} {text!r} is no bytes at all", "give at least 1 (16K, say)")
    if not match:
        raise UsageError(f"{flag} {text!r} is not a size", "write it as 16384, 16K or 16M (K = 1024)")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


def parse_count(flag: str, text: str, minimum: int = 0) -> int:
    if not re.fullmatch(r"\d+", text) or int(text) < minimum:
        raise UsageError(f"{flag} {text!r} is not a whole number of at least {minimum}")
    return int(text)


def check_relative_folder(flag: str, text: str) -> str:
    """A folder of the files folder: relative, no `.`, `..` or empty component."""
    parts = text.split("/")
    if text.startswith("/") or any(part in ("", ".", "..") for part in parts) or "\0" in text:
        raise UsageError(
            f"{flag} {text!r} is not a folder of the files folder",
            "give a relative path with no '.', '..' or empty component, such as work or data/out",
        )
    return text


def check_way_in(text: str) -> str:
    """The sender's own rules, so that serve never starts with a way in it cannot reach."""
    try:
        parse_address(text)
    except LinkRunError as problem:
        raise UsageError(f"--way-in: {problem.message}", problem.hint or
                         "give http://127.0.0.1:<port>/<path> or unix:<absolute socket path>") from None
    return text


class WayInFlags(NamedTuple):
    """--way-in, --as and --keyring, checked together; all None without a way in."""

    address: str | None = None
    agent: str | None = None
    keyring: str | None = None  # absolute


def way_in_flags(flags: Mapping[str, str], environ: Mapping[str, str]) -> WayInFlags:
    """The one check of the way-in flags, for serve, up and sweep alike:
    --no-way-in excludes the others, --way-in needs a good --as, and --as and
    --keyring mean nothing without --way-in. The keyring defaults as Link's."""
    address, agent = flags.get("--way-in"), flags.get("--as")
    if "--no-way-in" in flags and (address or agent is not None or "--keyring" in flags):
        raise UsageError("--no-way-in excludes --way-in, --as and --keyring", "give one or the other")
    if not address:
        if agent is not None or "--keyring" in flags:
            raise UsageError("--as and --keyring need --way-in <address>")
        return WayInFlags()
    check_way_in(address)
    if agent is None:
        raise UsageError("--way-in needs --as <agent id>")
    if not AGENT_ID.fullmatch(agent):
        raise UsageError(f"--as {agent!r} is not an agent id", "use letters, digits, '.', '_' and '-'")
    return WayInFlags(address, agent, os.path.abspath(flags.get("--keyring") or default_keyring(environ)))


class Limits(NamedTuple):
    """A call's limits; None: not limited."""

    memory: int | None = None  # bytes
    tasks: int | None = None
    cpu: int | None = None  # percent of one core (200: two cores' worth)

    def controllers(self) -> tuple[str, ...]:
        return tuple(CONTROLLERS[name] for name in CONTROLLERS if getattr(self, name) is not None)

    def flag(self) -> str:
        """serve's --limits value: `memory=<bytes>,tasks=<n>,cpu=<n>%`."""
        parts = [f"memory={self.memory}" if self.memory is not None else "",
                 f"tasks={self.tasks}" if self.tasks is not None else "",
                 f"cpu={self.cpu}%" if self.cpu is not None else ""]
        return ",".join(part for part in parts if part)

    def as_record(self) -> dict[str, int | None]:
        return {"memory": self.memory, "tasks": self.tasks, "cpu": self.cpu}

    @classmethod
    def of_record(cls, value: dict[str, int | None] | None) -> Limits | None:
        return cls(**value) if value else None


class BackgroundSettings(NamedTuple):
    """The background commands' settings: all required once --state is given
    (but for --state with --proxy alone, the proxy's state folder)."""

    state: str
    way_in: str | None  # None with --no-way-in
    agent: str | None  # --as
    keyring: str | None
    running: int  # --background: how many run at once; 0 turns them off
    timeout: int
    output: int
    keep: int
    per_day: int
    hops: int


class KeepSettings(NamedTuple):
    """A call's output kept past its answer (--keep-output, --keep-for,
    --keep-total, given together with --state): each cut stream of a call,
    its last `output` bytes, for `keep_for` seconds, within `total` bytes for
    the agent (oldest removed first). kept.py keeps and reads them."""

    state: str
    output: int  # bytes kept of one stream of one call: its last ones
    keep_for: int  # seconds
    total: int  # bytes of kept output in all, for the agent


class Serve(NamedTuple):
    files: str
    programs_path: str
    timeout: int
    output: int
    programs: tuple[str, ...]
    variables: tuple[tuple[str, str], ...]
    write: tuple[str, ...]
    proxy: bool
    state: str | None  # with background commands, the proxy, or both
    background: BackgroundSettings | None
    sandbox: tuple[str, ...]
    seccomp: str | None = None  # the syscall filter file, given to each call's bwrap
    limits: Limits | None = None  # each call's cgroup limits (--limits), where a cgroup can be had
    keep: KeepSettings | None = None  # a call's cut output kept for `read` (--keep-*)
    checks: str | None = None  # the agent's folder whose checks `up` leaves to serve (--checks; front/checks.py)
    # What the sandbox file allows that this machine lacked at up's look: refused as missing, not as not allowed.
    missing_programs: tuple[str, ...] = ()

    @property
    def offers_background(self) -> bool:
        return self.background is not None and self.background.running > 0


_SERVE_VALUED = {
    "--files", "--programs-path", "--timeout", "--output", "--program", "--missing-program", "--var", "--write",
    "--state", "--way-in", "--as", "--keyring", "--background", "--background-timeout",
    "--background-output", "--background-keep", "--background-per-day", "--hops", "--seccomp", "--limits",
    "--keep-output", "--keep-for", "--keep-total",
    "--checks",
}
_SERVE_SWITCHES = {"--proxy", "--no-way-in"}
_REPEATABLE = {"--program", "--missing-program", "--var", "--write"}
_KEEP_FLAGS = ("--keep-output", "--keep-for", "--keep-total")
_BACKGROUND_REQUIRED = (
    "--background", "--background-timeout", "--background-output", "--background-keep",
    "--background-per-day", "--hops",
)

SERVE_USAGE = (
    "lnk-link-run serve --files <folder> --programs-path <PATH> --timeout <duration> "
    "--output <bytes> [--program <program>]... [--missing-program <program>]... [--var NAME=VALUE]... "
    "[--write <folder>]... [--seccomp <file>] "
    "[--limits memory=<bytes>,tasks=<n>,cpu=<n>%] [--checks <agent's folder>] "
    "[--state <dir> [--proxy] [--keep-output <bytes> --keep-for <duration> --keep-total <bytes>] [(--way-in <address> --as <agent id> [--keyring <dir>] | "
    "--no-way-in) --background <n> --background-timeout <duration> --background-output <bytes> "
    "--background-keep <duration> --background-per-day <n> --hops <n>]] -- <sandbox>..."
)


class Flags(dict[str, str]):
    """Each flag given once → its value (a switch's is ""); the repeatable ones in `many`."""

    def __init__(self) -> None:
        super().__init__()
        self.many: dict[str, list[str]] = {}


def split_flags(
    argv: list[str], valued: set[str], switches: set[str], repeatable: set[str]
) -> tuple[Flags, list[str] | None]:
    """argv → (Flags, rest after `--` or None).

    Hand-rolled rather than argparse so that every error is one line naming the
    flag, and `--` splits exactly once (the sandbox argv has flags of its own).
    """
    flags = Flags()
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            return flags, argv[index + 1:]
        name, eq, inline = arg.partition("=")
        if name in switches and not eq:
            flags[name] = ""
            index += 1
            continue
        if name not in valued:
            raise UsageError(f"unknown flag {arg!r}", "see --help")
        if eq:
            value = inline
            index += 1
        elif index + 1 < len(argv):
            value = argv[index + 1]
            index += 2
        else:
            raise UsageError(f"{name} needs a value")
        if name in repeatable:
            flags.many.setdefault(name, []).append(value)
        elif name in flags:
            raise UsageError(f"{name} is given twice", "give it once")
        else:
            flags[name] = value
    return flags, None


def parse_serve(argv: list[str]) -> Serve:
    flags, sandbox = split_flags(argv, _SERVE_VALUED, _SERVE_SWITCHES, _REPEATABLE)
    for required in ("--files", "--programs-path", "--timeout", "--output"):
        if required not in flags:
            raise UsageError(f"{required} is required", f"usage: {SERVE_USAGE}")
    if not sandbox:
        raise UsageError(
            "no sandbox after --: serve never runs a program unsandboxed",
            "end the command line with -- and the sandbox command, such as: -- bwrap ... "
            "(lnk-link-run up builds it)",
        )
    files = os.path.abspath(str(flags["--files"]))
    if not os.path.isdir(files):
        raise UsageError(f"--files {files!r} is not a folder", "create it or give another")

    programs = tuple(flags.many.get("--program", []))
    missing_programs = tuple(flags.many.get("--missing-program", []))
    for flag, program in [("--program", p) for p in programs] + [("--missing-program", p) for p in missing_programs]:
        if program != "*" and ("/" in program and not program.startswith("/")):
            raise UsageError(f"{flag} {program!r} is neither a bare name, an absolute path nor *")
        if not program or any(c in program for c in "=\0\n"):
            raise UsageError(f"{flag} {program!r} holds '=', a NUL or a newline, or is empty")

    variables = []
    for item in flags.many.get("--var", []):
        name, eq, value = item.partition("=")
        if not eq or not VAR_NAME.fullmatch(name) or "\0" in value:
            raise UsageError(f"--var {item!r} is not NAME=VALUE", "NAME is letters, digits and _")
        variables.append((name, value))

    write = tuple(check_relative_folder("--write", w) for w in flags.many.get("--write", []))
    proxy = "--proxy" in flags
    if proxy and "--state" not in flags:
        raise UsageError("--proxy needs --state <dir>", "the agent's proxy lives in its state folder")
    seccomp = None
    if "--seccomp" in flags:
        if not (write or proxy):
            raise UsageError("--seccomp needs --write", "the filter is part of the per-call sandbox, which --write asks for")
        seccomp = os.path.abspath(str(flags["--seccomp"]))
        if not os.access(seccomp, os.R_OK):
            raise UsageError(f"--seccomp {seccomp!r} cannot be read", "give the filter file that lnk-link-run up writes")

    return Serve(
        files=files,
        programs_path=str(flags["--programs-path"]),
        timeout=parse_duration("--timeout", str(flags["--timeout"])),
        output=parse_size("--output", str(flags["--output"])),
        programs=programs,
        variables=tuple(variables),
        write=write,
        proxy=proxy,
        state=os.path.abspath(str(flags["--state"])) if "--state" in flags else None,
        background=_parse_background(flags),
        sandbox=tuple(sandbox),
        seccomp=seccomp,
        limits=parse_limits("--limits", str(flags["--limits"])) if "--limits" in flags else None,
        keep=_parse_keep(flags),
        checks=os.path.abspath(str(flags["--checks"])) if "--checks" in flags else None,
        missing_programs=missing_programs,
    )


def _parse_keep(flags: Flags) -> KeepSettings | None:
    """The three --keep flags, all or none, with --state; none: no output is kept past the answer."""
    given = [flag for flag in _KEEP_FLAGS if flag in flags]
    if not given:
        return None
    if "--state" not in flags:
        raise UsageError(f"{given[0]} needs --state", "the kept output lives in the agent's state folder")
    for flag in _KEEP_FLAGS:
        if flag not in flags:
            raise UsageError(f"{given[0]} needs {flag}", "give --keep-output, --keep-for and --keep-total together")
    keep = KeepSettings(
        state=os.path.abspath(str(flags["--state"])),
        output=parse_size("--keep-output", str(flags["--keep-output"])),
        keep_for=parse_duration("--keep-for", str(flags["--keep-for"])),
        total=parse_size("--keep-total", str(flags["--keep-total"])),
    )
    if keep.total < 2 * keep.output:  # else a call's second stream could push out its first at once
        raise UsageError(f"--keep-total {flags['--keep-total']} cannot hold one call's two streams of "
                         f"--keep-output {flags['--keep-output']}", "give at least twice --keep-output")
    return keep


def parse_limits(flag: str, text: str) -> Limits:
    """`memory=4G,tasks=1024,cpu=200%` (each part optional, cpu in percent of one core) → Limits."""
    hint = "write memory=<size>,tasks=<n>,cpu=<n>%, such as memory=4G,tasks=1024,cpu=200%"
    values: dict[str, int] = {}
    for part in filter(None, text.split(",")):
        name, eq, value = part.partition("=")
        if not eq or name not in ("memory", "tasks", "cpu") or name in values:
            raise UsageError(f"{flag} {text!r}: {part!r} is not one of memory=, tasks=, cpu= (each once)", hint)
        if name == "memory":
            values[name] = parse_size(f"{flag} memory", value)
        elif name == "tasks":
            values[name] = parse_count(f"{flag} tasks", value, minimum=1)
        else:
            values[name] = parse_count(f"{flag} cpu", value.removesuffix("%"), minimum=1)
            if not value.endswith("%"):
                raise UsageError(f"{flag} cpu {value!r} is not a percentage of one core", hint)
    return Limits(**values)


def _parse_background(flags: Flags) -> BackgroundSettings | None:
    background_flags = [f for f in _BACKGROUND_REQUIRED + ("--way-in", "--as", "--keyring", "--no-way-in") if f in flags]
    if "--state" not in flags:
        if background_flags:
            raise UsageError(f"{background_flags[0]} needs --state", "give --state <dir> or drop it")
        return None
    if not background_flags and ("--proxy" in flags or any(flag in flags for flag in _KEEP_FLAGS)):
        return None  # a state folder for the proxy or the kept output alone: no background commands
    for required in _BACKGROUND_REQUIRED:
        if required not in flags:
            raise UsageError(f"{required} is required with --state")
    if not flags.get("--way-in") and "--no-way-in" not in flags:
        raise UsageError(
            "--state needs --way-in <address> --as <agent id>, or --no-way-in",
            "background commands tell their end through the way in",
        )
    way_in = way_in_flags(flags, os.environ)
    return BackgroundSettings(
        state=os.path.abspath(str(flags["--state"])),
        way_in=way_in.address,
        agent=way_in.agent,
        keyring=way_in.keyring,
        running=parse_count("--background", str(flags["--background"])),
        timeout=parse_duration("--background-timeout", str(flags["--background-timeout"])),
        output=parse_size("--background-output", str(flags["--background-output"])),
        keep=parse_duration("--background-keep", str(flags["--background-keep"])),
        per_day=parse_count("--background-per-day", str(flags["--background-per-day"])),
        hops=parse_count("--hops", str(flags["--hops"])),
    )

"""The record, written once: its states, its `told` values, its fields,
records ↔ orjson, and the records' flocks (the folder's layout: layout.py).

A record is written whole or not at all (filing.write_whole): beside,
fdatasync, renamed, the folder synced.

Imported by serve, the supervisor, the sweep and the told message: stdlib
only at import (orjson when a record is read or written), and no `typing`:
the record's type (`Record`, a TypedDict) and its states' (`StateName`,
`ToldName`, Literals) are the type checker's alone, so a record stays the
dict orjson gives and writes, and a key it does not know (a newer or older
format's) is kept when it is written again.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import os
import re
import time

from ..kernel import process_stat
from .filing import write_whole
from .layout import BAD, LOCK, RECORD, STOP, path

VERSION = 1
ID = re.compile(r"[a-z2-7]{16}")  # matched whole (fullmatch)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final, Literal, NotRequired, TypedDict

    # Each name once here, each as a constant of State or Told below: mypy checks
    # every constant against these (RUNNING_STATES … SETTLED), test_record.py
    # that every name has one.
    StateName = Literal["starting", "running", "exited", "stopped", "timed out", "lost", "failed to start"]
    ToldName = Literal["untold", "telling", "told", "given up", "no way in"]

    class CgroupRecord(TypedDict):
        """The command's cgroup (sandboxing/cgroups.py: Group.as_record)."""

        version: int
        folders: list[str]

    class Rotated(TypedDict, total=False):
        """What a rotation of the output file writes into the record (detached/outfile.py)."""

        inode: int | None  # as the record's (an update's types must be the same)
        kept_from: int
        prev_inode: int | None
        prev_kept_from: int
        dropped: int

    class LinesBatch(TypedDict):
        """A tell_on message, sealed before it is sent (messages/told_lines.py)."""

        n: int  # its number, from 1
        lines: list[tuple[int, str]]  # [offset, text] each (a JSON pair)
        more: int  # matching lines found past those shown
        state: StateName
        bytes: int
        seconds: float

    # The record, every field of the format (new_record says what each is).
    # "as" is a keyword, hence the call form. NotRequired: absent from a
    # record an older serve wrote, or written only once it happens.
    Record = TypedDict("Record", {
        "v": int, "id": str, "argv": list[str], "write": list[str], "proxy": str | None,
        "seccomp": NotRequired[str | None], "files": str, "folder": str, "program": str,
        "args": list[str], "program_argv": list[str], "started": float, "timeout": float, "output": int,
        "background_output": int, "keep": float, "way_in": str | None, "as": str | None,
        "keyring": str | None, "thread": str, "hops": int, "state": StateName,
        "group": int | None, "leader_pid": int | None, "leader_start": int | None, "boot_id": str | None,
        "init_pid": NotRequired[int | None], "init_start": NotRequired[int | None],
        "limits": NotRequired[dict[str, int | None] | None], "cgroup": NotRequired[CgroupRecord | None],
        "limit": NotRequired[str | None], "inode": int | None, "kept_from": int, "bytes": int,
        "prev_inode": NotRequired[int | None], "prev_kept_from": NotRequired[int], "dropped": NotRequired[int],
        "ended": float | None, "exit": int | None, "signal": str | None, "told": ToldName,
        "first_try": float | None, "sweep_first_try": float | None, "told_at": float | None,
        "tell_on": NotRequired[str | None], "lines_gathered": NotRequired[list[tuple[int, str]]],
        "lines_more": NotRequired[int], "lines_batch": NotRequired[LinesBatch | None],
        "lines_sent": NotRequired[int], "lines_told_at": NotRequired[float | None],
        "tty": NotRequired[list[int] | None],
    })

    class KeptItem(TypedDict):
        """What read and find show of a kept output (front/kept.py) in a record's
        place: the fields a reader asks a record for are never there."""

        id: str
        state: Literal["kept"]
        program: str | None
        args: list[str] | None
        started: NotRequired[float]
        exit: NotRequired[None]
        signal: NotRequired[None]
        limit: NotRequired[None]
        dropped: NotRequired[int]
        proxy: NotRequired[None]
        leader_pid: NotRequired[None]

    Shown = Record | KeptItem  # a background command's record, or a kept output's stand-in


class State:
    """A record's `state`: starting, then running, then one of the ends."""

    STARTING: Final = "starting"  # written by start; the supervisor has not begun the program
    RUNNING: Final = "running"  # the program runs (the supervisor wrote its group)
    EXITED: Final = "exited"  # it exited of itself, or was killed by a signal not ours
    STOPPED: Final = "stopped"  # `stop` asked (the reason is in the told text)
    TIMED_OUT: Final = "timed out"  # --background-timeout passed
    LOST: Final = "lost"  # its supervisor died, or the agent stopped: it ended unobserved
    FAILED_TO_START: Final = "failed to start"  # never ran


class Told:
    """A record's `told`: whether the conversation has heard of its end."""

    UNTOLD: Final = "untold"  # to be told (by its supervisor, else a sweep)
    TELLING: Final = "telling"  # a delivery is under way (a crash mid-way leaves it: tried again)
    TOLD: Final = "told"  # delivered (or the tool error said it: a failed spawn)
    GIVEN_UP: Final = "given up"  # the way in refused it, or stayed unreachable for the window
    NO_WAY_IN: Final = "no way in"  # serve has no way in: nobody is ever told


# A stop file's reason that ends the command lost, not stopped: the agent (or
# its service) stopping, told when the agent is back.
AGENT_STOPPING = "agent stopping"

RUNNING_STATES: tuple[StateName, ...] = (State.STARTING, State.RUNNING)
LINE_SHOWN = 512  # bytes of a found line kept and shown at most: by read, and in a record's lines told
ENDED_STATES: tuple[StateName, ...] = (State.EXITED, State.STOPPED, State.TIMED_OUT, State.LOST, State.FAILED_TO_START)
TO_TELL: tuple[ToldName, ...] = (Told.UNTOLD, Told.TELLING)
SETTLED: tuple[ToldName, ...] = (Told.TOLD, Told.GIVEN_UP, Told.NO_WAY_IN)  # nothing more to tell: its files may go once kept


def is_command_id(value: object) -> bool:
    """Whether `value` has a background command's id's form (new_id's)."""
    return isinstance(value, str) and ID.fullmatch(value) is not None


def new_id() -> str:
    return base64.b32encode(os.urandom(10)).decode().lower()


def new_record(command_id: str, *, argv: list[str], write: list[str], proxy: str | None, seccomp: str | None,
               files: str, folder: str, program: str, args: list[str], program_argv: list[str],
               timeout: float, output: int, background_output: int, keep: float, way_in: str | None,
               agent: str | None, keyring: str | None, thread: str, hops: int, limits: dict[str, int | None] | None,
               tell_on: str | None = None, tty: list[int] | None = None) -> Record:
    """A new record, state `starting`: every field of the format, in one place.

    What start fixes (the supervisor needs it, the sweep and the tools read it):
    `v` the format's version; `id`; `argv` the sandbox's argv, fixed part;
    `write` and `proxy` (the proxy's socket folder, or None) for the per-call
    part the gate appends; `seccomp` the filter's path or None; `files` the
    files folder; `folder` the call's folder in it; `program`, `args` as the
    agent gave them, `program_argv` as run; `started` (epoch seconds);
    `timeout` (--background-timeout, seconds); `output` (serve's --output, for
    the told text) and `background_output` (bytes kept); `keep` (seconds the
    files stay once told); `way_in`, `as`, `keyring` (absolute) to tell by;
    `thread` the conversation and `hops` from a person; `limits` the
    [limits] as a dict, or None; `tell_on` the pattern whose lines are told
    as they come, or None; `tty` the terminal's [columns, rows] when it runs
    on one (its program_argv then starts the terminal), or None.

    What the supervisor adds as it runs: `state` (State); `group`,
    `leader_pid`, `leader_start` (clock ticks since boot), `boot_id`, and the
    sandbox's `init_pid`, `init_start` (what a sweep may kill, checked against
    reused pids); `cgroup` (its path) and `limit` (which limit it hit); the
    output file's `inode`, `kept_from` (bytes dropped from its start),
    `bytes` (written in all), `prev_inode`, `prev_kept_from` (the file before
    the last rotation, for a reader in between) and `dropped` (bytes lost to a
    full disk); `ended` (epoch seconds), `exit`, `signal`.

    What the telling adds: `told` (Told); `first_try` (the supervisor's
    window), `sweep_first_try` (the sweeps'), `told_at`. With `tell_on`, the
    lines told (messages/told_lines.py): `lines_gathered` (found, not yet in a
    message: [offset, text] each), `lines_more` (found past those shown),
    `lines_batch` (the message being told, until told or given up),
    `lines_sent` (messages settled), `lines_told_at`.

    Optional fields are absent or None until set (_OPTIONAL names their types).
    """
    return {
        "v": VERSION, "id": command_id, "argv": argv, "write": write, "proxy": proxy, "seccomp": seccomp,
        "files": files, "folder": folder, "program": program, "args": args, "program_argv": program_argv,
        "started": now(), "timeout": timeout, "output": output, "background_output": background_output,
        "keep": keep, "way_in": way_in, "as": agent, "keyring": keyring, "thread": thread, "hops": hops,
        "state": State.STARTING, "group": None, "leader_pid": None, "leader_start": None, "boot_id": None,
        "init_pid": None, "init_start": None, "limits": limits, "cgroup": None, "limit": None,
        "inode": None, "kept_from": 0, "bytes": 0, "ended": None, "exit": None, "signal": None,
        "told": Told.NO_WAY_IN if way_in is None else Told.UNTOLD,
        "first_try": None, "sweep_first_try": None, "told_at": None, "tell_on": tell_on,
        "tty": tty,
    }


class BadRecord(Exception):
    """A record that is not whole: unparsable, cut short, or missing what every reader needs."""


# What every reader of a record indexes, and the types it must have.
_NUMBER = (int, float)
_REQUIRED: dict[str, type | tuple[type, ...]] = {"id": str, "state": str, "thread": str, "started": _NUMBER, "files": str, "program": str,
             "args": list, "told": str}
_OPTIONAL: dict[str, type | tuple[type, ...]] = {"folder": str, "ended": _NUMBER, "keep": _NUMBER, "timeout": _NUMBER, "inode": int,
             "kept_from": int, "bytes": int, "prev_inode": int, "prev_kept_from": int, "dropped": int,
             "tell_on": str, "lines_gathered": list, "lines_more": int, "lines_batch": dict, "lines_sent": int,
             "tty": list}


def load(state: str, command_id: str) -> Record | None:
    """The record, or None when there is none or it is bad (a sweep sets a bad one aside)."""
    try:
        return load_strict(state, command_id)
    except BadRecord:
        return None


def load_strict(state: str, command_id: str) -> Record | None:
    """The record, None when there is none; BadRecord, saying why, when it is not whole."""
    try:
        with open(path(state, command_id, RECORD), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    import orjson  # here, not at the top: the told message reads states without it

    try:
        record: Record = orjson.loads(data)  # what _fault checks below is what every reader indexes
    except orjson.JSONDecodeError as error:
        raise BadRecord(f"not JSON ({len(data)} bytes; {error})") from None
    why = _fault(record, command_id)
    if why:
        raise BadRecord(why)
    return record


def _fault(record: object, command_id: str) -> str | None:
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    for name, kind in _REQUIRED.items():
        if name not in record:
            return f"no {name!r}"
        if not _is(record[name], kind):
            return f"{name!r} is not a {_kind_name(kind)}"
    for name, kind in _OPTIONAL.items():
        if record.get(name) is not None and not _is(record[name], kind):
            return f"{name!r} is not a {_kind_name(kind)}"
    if record["id"] != command_id:
        return f"its id is {record['id']!r}"
    if record["state"] not in RUNNING_STATES + ENDED_STATES:
        return f"unknown state {record['state']!r}"
    return None


def _is(value: object, kind: type | tuple[type, ...]) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return "number" if isinstance(kind, tuple) else {str: "string", list: "list", int: "whole number", dict: "object"}[kind]


def set_aside(state: str, command_id: str) -> str:
    """Move a bad record and its files (not its lock) into `<state>/bad/`,
    where no reader looks; the caller holds its lock and removes it after.
    Returns the record's new path."""
    folder = os.path.join(state, BAD)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    for name in os.listdir(state):
        if name.startswith(command_id + ".") and name != command_id + LOCK:
            os.replace(os.path.join(state, name), os.path.join(folder, name))
    return os.path.join(folder, command_id + RECORD)


def write(state: str, command_id: str, record: Record, synced: bool = True) -> None:
    """Write the record whole or not at all (filing.write_whole)."""
    import orjson

    write_whole(path(state, command_id, RECORD), orjson.dumps(record), synced=synced)


def ids(state: str) -> list[str]:
    """Every command id with a record in the state folder."""
    try:
        names = os.listdir(state)
    except FileNotFoundError:
        return []
    return [name[:-5] for name in names if name.endswith(RECORD) and ID.fullmatch(name[:-5])]


def create_lock(state: str, command_id: str) -> int:
    """Create `<id>.lock` exclusively and take its flock; the id is ours after this."""
    fd = os.open(path(state, command_id, LOCK), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def try_lock(state: str, command_id: str) -> int | None:
    """Take a record's lock without waiting and without creating it.

    Returns the descriptor (the caller holds the lock until it closes it), or
    None when a supervisor holds it, or when the lock or the record went away
    or was replaced meanwhile.
    """
    lock_path = path(state, command_id, LOCK)
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    try:
        same = os.stat(lock_path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        same = False
    if not same or not os.path.exists(path(state, command_id, RECORD)):
        os.close(fd)
        return None
    return fd


def is_held(state: str, command_id: str) -> bool:
    """True while a supervisor holds the record's lock."""
    fd = try_lock(state, command_id)
    if fd is None:
        return os.path.exists(path(state, command_id, LOCK))
    os.close(fd)
    return False


def gate_alive(record: Record) -> bool:
    """False once the program's gate has ended (it dies with its supervisor,
    gate.py): the record's end is being written, by its supervisor or a sweep.
    True while it runs, and before it is known (a command still starting)."""
    leader = record.get("leader_pid")
    if not leader:
        return True
    if record.get("boot_id") != boot_id():
        return False  # another boot: that process is long gone
    fields = process_stat(leader)
    # A zombie is gone too: its supervisor died, and no one may reap it soon.
    return fields is not None and fields[0] not in (b"Z", b"X") and int(fields[19]) == record.get("leader_start")


def running_ids(state: str) -> list[str]:
    """The commands that run: a record that says so, and its supervisor holding its lock."""
    running = []
    for command_id in ids(state):
        record = load(state, command_id)
        if record and record["state"] in RUNNING_STATES and is_held(state, command_id):
            running.append(command_id)
    return running


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def process_start(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (field 22 of its stat)."""
    fields = process_stat(pid)
    try:
        return int(fields[19]) if fields is not None else None
    except (IndexError, ValueError):
        return None


def write_stop(state: str, command_id: str, reason: str) -> None:
    """A stop request: written beside, then linked into place whole.

    A link, unlike a rename, never replaces a stop file already there: the
    first reason wins.
    """
    final = path(state, command_id, STOP)
    temporary = f"{final}.{os.urandom(4).hex()}.new"
    with open(temporary, "w") as f:
        f.write(reason)
    try:
        os.link(temporary, final)
    except FileExistsError:
        pass
    finally:
        os.unlink(temporary)


def now() -> float:
    return time.time()


# The signal a limit ends a program with (its name, its number): SIGXCPU at its
# CPU time, the out-of-memory killer's SIGKILL, SIGXFSZ past the largest file.
LIMIT_SIGNALS = {"cpu": ("SIGXCPU", 24), "memory": ("SIGKILL", 9), "file": ("SIGXFSZ", 25)}


def killed_by_limit(limit: object, exit_status: object, signal: object = None) -> bool:
    """Whether the limit that bit is what ended the program: its signal, or
    an exit of 128 + its number (through bwrap)."""
    name, number = LIMIT_SIGNALS.get(str(limit), ("", 0))
    return bool(name) and (signal == name or exit_status == 128 + number)


def limit_words(record: Shown | dict[str, object]) -> str:
    """Which words say the limit it ended on: its `limit`, but "allocation"
    for a memory limit that did not kill it (no cgroup holds memory there:
    an allocation was refused, and the program ended of itself), "" for none."""
    limit = str(record.get("limit") or "")
    killed = killed_by_limit(limit, record.get("exit"), record.get("signal"))
    return "allocation" if limit == "memory" and not killed else limit

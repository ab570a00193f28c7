"""The state folder: records ↔ orjson, atomic writes, and the flocks.

Per command, `<id>.lock` (its flock held by the supervisor for its whole
life), `<id>.json` (the record), `<id>.in`, `<id>.log`, `<id>.stop`. A record
is written whole or not at all: beside, fdatasync, renamed, the folder synced.

Imported by serve, the supervisor and the sweep: stdlib and orjson only.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import os
import re
import secrets
import time

import orjson

from .errors import LinkRunError, UsageError

VERSION = 1
ID = re.compile(r"[a-z2-7]{16}")  # matched whole (fullmatch)
RUNNING_STATES = ("starting", "running")
ENDED_STATES = ("exited", "stopped", "timed out", "lost", "failed to start")


def new_id() -> str:
    return base64.b32encode(secrets.token_bytes(10)).decode().lower()


def path(state: str, command_id: str, suffix: str) -> str:
    return os.path.join(state, command_id + suffix)


def ensure_state(state: str) -> None:
    """Create the state folder (0700) when missing; refuse one we cannot trust."""
    try:
        os.makedirs(state, mode=0o700, exist_ok=True)
    except OSError as error:
        raise LinkRunError(f"cannot create the state folder {state}: {error.strerror}",
                           "check its parent folder's permissions") from None
    if os.path.islink(state) or not os.path.isdir(state):
        raise LinkRunError(f"the state folder {state} is not a folder", "give a folder of its own")


UNTRUSTED_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse", "9p")


def filesystem_of(path: str, mountinfo: str | None = None) -> str:
    """The type of the filesystem that holds `path` (or, when it does not
    exist yet, its nearest existing parent), from /proc/self/mountinfo."""
    path = os.path.realpath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if mountinfo is None:
        with open("/proc/self/mountinfo") as f:
            mountinfo = f.read()
    best, kind = "", "unknown"
    for line in mountinfo.splitlines():
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        point = parts[4].replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, rest.split()[0]
    return kind


def check_filesystem(state: str) -> None:
    """flock and inotify do not hold on network and FUSE filesystems: refuse them."""
    kind = filesystem_of(state)
    if kind.split(".")[0] in UNTRUSTED_FILESYSTEMS:
        raise UsageError(f"--state {state} is on a {kind} filesystem, where locks and file watches do not hold",
                           "give a state folder on a local disk")


class BadRecord(Exception):
    """A record that is not whole: unparsable, cut short, or missing what every reader needs."""


# What every reader of a record indexes, and the types it must have.
_NUMBER = (int, float)
_REQUIRED = {"id": str, "state": str, "thread": str, "started": _NUMBER, "files": str, "program": str,
             "args": list, "told": str}
_OPTIONAL = {"folder": str, "ended": _NUMBER, "keep": _NUMBER, "timeout": _NUMBER, "inode": int,
             "kept_from": int, "bytes": int, "prev_inode": int, "prev_kept_from": int, "dropped": int}


def load(state: str, command_id: str) -> dict | None:
    """The record, or None when there is none or it is bad (a sweep sets a bad one aside)."""
    try:
        return load_strict(state, command_id)
    except BadRecord:
        return None


def load_strict(state: str, command_id: str) -> dict | None:
    """The record, None when there is none; BadRecord, saying why, when it is not whole."""
    try:
        with open(path(state, command_id, ".json"), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        record = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise BadRecord(f"not JSON ({len(data)} bytes; {error})") from None
    why = _fault(record, command_id)
    if why:
        raise BadRecord(why)
    return record


def _fault(record, command_id: str) -> str | None:
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


def _is(value, kind) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def _kind_name(kind) -> str:
    return "number" if kind == _NUMBER else {str: "string", list: "list", int: "whole number"}[kind]


BAD = "bad"  # the state folder's subfolder for records set aside


def set_aside(state: str, command_id: str) -> str:
    """Move a bad record and its files (not its lock) into `<state>/bad/`,
    where no reader looks; the caller holds its lock and removes it after.
    Returns the record's new path."""
    folder = os.path.join(state, BAD)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    for name in os.listdir(state):
        if name.startswith(command_id + ".") and name != command_id + ".lock":
            os.replace(os.path.join(state, name), os.path.join(folder, name))
    return os.path.join(folder, command_id + ".json")


def write(state: str, command_id: str, record: dict) -> None:
    """Write the record whole or not at all."""
    final = path(state, command_id, ".json")
    temporary = f"{final}.{secrets.token_hex(4)}.tmp"
    data = orjson.dumps(record)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fdatasync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(temporary)
        raise
    os.close(fd)
    os.rename(temporary, final)
    sync_folder(state)


def sync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ids(state: str) -> list[str]:
    """Every command id with a record in the state folder."""
    try:
        names = os.listdir(state)
    except FileNotFoundError:
        return []
    return [name[:-5] for name in names if name.endswith(".json") and ID.fullmatch(name[:-5])]


def create_lock(state: str, command_id: str) -> int:
    """Create `<id>.lock` exclusively and take its flock; the id is ours after this."""
    fd = os.open(path(state, command_id, ".lock"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def try_lock(state: str, command_id: str) -> int | None:
    """Take a record's lock without waiting and without creating it.

    Returns the descriptor (the caller holds the lock until it closes it), or
    None when a supervisor holds it, or when the lock or the record went away
    or was replaced meanwhile.
    """
    lock_path = path(state, command_id, ".lock")
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
    if not same or not os.path.exists(path(state, command_id, ".json")):
        os.close(fd)
        return None
    return fd


def is_held(state: str, command_id: str) -> bool:
    """True while a supervisor holds the record's lock."""
    fd = try_lock(state, command_id)
    if fd is None:
        return os.path.exists(path(state, command_id, ".lock"))
    os.close(fd)
    return False


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def process_start(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (field 22 of its stat)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def write_stop(state: str, command_id: str, reason: str) -> None:
    """A stop request: written beside, then linked into place whole.

    A link, unlike a rename, never replaces a stop file already there: the
    first reason wins.
    """
    final = path(state, command_id, ".stop")
    temporary = f"{final}.{secrets.token_hex(4)}.new"
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

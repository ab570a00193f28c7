"""The state folder's layout (DESIGN.md §3), written once: every file's name,
with its purpose and its writer, and the folder made and checked. Every
process that shares the folder (serve, the supervisors, the sweep, the
proxy, up) finds a file by these names, never by a name of its own.

stdlib only, and no `typing`: the supervisor imports it.
"""

from __future__ import annotations

import os

from ..errors import LinkRunError, UsageError

# Per command, `path(state, id, suffix)`:
RECORD = ".json"  # the record, written whole
LOCK = ".lock"  # its flock held by the supervisor for its whole life; the id is unique by O_EXCL on it
INPUT = ".in"  # the program's input (0600), removed once fed
LOG = ".log"  # the supervisor's stderr
STOP = ".stop"  # a stop request holding its reason, linked into place
WAKE = ".wake"  # a sweep's way in for a supervisor backing off, renamed into place
WRITE = ".write"  # its supervisor's socket (0600), where serve hands it what `write` sends (detached/input.py)

# The state folder's own, `os.path.join(state, name)`:
START_LOCK = "start.lock"  # held from the caps' check to the spawn; holds its holder's pid
SWEEP_LOCK = "sweep.lock"  # one sweep at a time
STARTS = "starts"  # one line per accepted start, for the day's cap
REMOVED = "removed"  # once `remove` began: no start any more
BAD = "bad"  # a subfolder: records set aside, where no reader looks
SECCOMP = "seccomp.bpf"  # the sandbox's syscall filter, written by up
PROXY_SETTINGS = "proxy.json"  # what the agent's proxy admits, written by up
PROXY_FOLDER = "proxy"  # a subfolder holding only the proxy's sockets (mode 0700: no sandbox sees it)
PROXY_SOCKET = "proxy.sock"  # in PROXY_FOLDER
PROXY_HAND = "hand.sock"  # in PROXY_FOLDER: where serve and the supervisors hand the proxy a call's sandbox
PROXY_LOCK = "proxy.lock"  # held by the one running proxy
PROXY_USERS = "proxy.users"  # shared by each serve and supervisor that needs the proxy
PROXY_LOG = "proxy.log"  # the proxy's stderr
PROXY_REFUSED = "proxy-refused.log"  # the latest refused connections (and `.old`)
ETC_VIEWS = "etc"  # a subfolder: the sandbox's prepared /etc views (etcview.py), each beside its `.print`
ETC_VIEW = "etc.view"  # a link to the current view in ETC_VIEWS, bound read-only as each sandbox's /etc
ETC_LOCK = "etc.lock"  # held by whoever rebuilds the view; its mtime: when the host's /etc was last looked at
KEPT = "kept"  # a subfolder (0700): calls' output kept past their answers, by id (front/kept.py)

# In the files folder (the agent reads them; no sandbox writes them):
BACKGROUND = "background"  # the folder of the output files, made with mkdirat, never a link


def output_name(command_id: str) -> str:
    """A command's output file, in BACKGROUND."""
    return f"{command_id}.out"


def shown_output(command_id: str) -> str:
    """A command's output file as the agent names it, in its files folder."""
    return f"{BACKGROUND}/{output_name(command_id)}"


def next_output_name(command_id: str) -> str:
    """The output file during a rotation, renamed over `output_name`."""
    return f"{command_id}.out.next"


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

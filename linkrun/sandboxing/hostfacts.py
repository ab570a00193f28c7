"""Facts of this machine that the sandbox argv depends on, read once (at `up`)."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator, Sequence
from typing import NamedTuple

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Top-level system folders: on a merged-/usr system they are links into
# /usr, replicated as links; elsewhere they are bound read-only.
ROOT_FOLDERS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# What /proc lists of the kernel's keys: every key its reader's uid may view,
# possessed or not (a `user` key is viewable by its owner), and each uid's count.
KEY_FILES = ("/proc/keys", "/proc/key-users")


def present(paths: Sequence[str]) -> tuple[str, ...]:
    return tuple(path for path in paths if os.path.exists(path))


class Host(NamedTuple):
    """Facts of this machine the argv depends on, gathered once (at `up`)."""

    bwrap: str
    prlimit: str
    disable_userns: bool  # bubblewrap ≥ 0.8 has --disable-userns
    root: tuple[tuple[str, str | None], ...]  # (/bin, "usr/bin") a link; (/bin, None) a folder
    nproc: int  # --nproc: the uid's current count of tasks plus a wide margin
    fsize_max: int | None  # the hard RLIMIT_FSIZE, which prlimit cannot raise
    memory_total: int = 0  # bytes of memory this machine has
    cpus: int = 1  # the cores this process may run on
    key_files: tuple[str, ...] = present(KEY_FILES)  # those this kernel has (read once, at import)


def bwrap_has(bwrap: str, option: str) -> bool:
    """Whether this bwrap takes `option`: read in its file where that is
    bwrap itself (an executable whose usage text names its options), else
    (a wrapper, a file we may not read) asked of its --help. Read, not run:
    `up` gathers these facts on the way to serve's first answer, and a spawn
    there cost a fork and a process to wait for."""
    try:
        with open(bwrap, "rb") as f:
            data = f.read(1 << 22)
    except OSError:
        data = b""
    if data.startswith(b"\x7fELF") and b"--unshare-user" in data:
        return option.encode() in data
    import subprocess

    from ..errors import LinkRunError

    try:
        help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        raise LinkRunError(f"cannot run {bwrap}: {error}", "reinstall bubblewrap") from None
    return option in help_text


def hidden_keys(host: Host) -> list[str]:
    """bwrap's flags that show KEY_FILES empty: /dev/null bound over each
    (a device: `--ro-bind` would mount it nodev, and unreadable)."""
    return [arg for path in host.key_files for arg in ("--dev-bind", "/dev/null", path)]


def entries(top: str, names: Sequence[str]) -> Iterator[tuple[str, str | None]]:
    for name in names:
        path = os.path.join(top, name)
        if os.path.islink(path):
            yield path, os.readlink(path)
        elif os.path.exists(path):
            yield path, None


def memory_total() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def hard_limit(which: int) -> int | None:
    hard = resource.getrlimit(which)[1]
    return None if hard == resource.RLIM_INFINITY else hard


def count_tasks(uid: int) -> int:
    """How many tasks (threads included: RLIMIT_NPROC counts them) the uid runs."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                pass  # ended meanwhile
    return count


def nproc_limit(margin: int) -> int:
    """The uid's current count plus the margin, never above the hard limit
    (which prlimit could not raise: every call would fail)."""
    wanted = count_tasks(os.getuid()) + margin
    hard = hard_limit(resource.RLIMIT_NPROC)
    return wanted if hard is None else min(wanted, hard)

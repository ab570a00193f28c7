"""Per-call limits where no cgroup can be had: rlimits inside the sandbox.

A call's limits hold through its cgroup (cgroups.py) where this process may
make one: root, or a delegated subtree. An ordinary user without one (no
systemd user session: containers, servers, CI) gets what rlimits can hold
instead, set on the sandbox's init while bwrap holds the program
(launch.py), so the program and everything it starts inherit them, and no
process of serve's has them:

  memory  RLIMIT_DATA, for each process: its heap and its private writable
          mappings, reserved or touched. Past it an allocation fails
          (Python's MemoryError, ENOMEM); nothing is killed. Not covered:
          the call's processes together (each has its own), shared mappings
          (MAP_SHARED), /tmp and /dev/shm (their own size), the page cache.
          RLIMIT_AS would also count reservations never used: Node's V8
          reserves gigabytes of address space and dies at start under it.
  tasks   RLIMIT_NPROC. Since Linux 5.14 the kernel counts it in each user
          namespace (ucounts), and each call has one of its own: it counts
          the call's processes and threads alone, as the cgroup's pids.max
          does. Before 5.14 it counts every process of the user's uid on the
          host, so it is not used there. It binds nothing for root.
  cpu     RLIMIT_CPU, for each process: CPU time, not a rate. The cap
          (percent of one core) times the longest the launch may run, the
          CPU time the cap would have let one process have: past it the
          kernel sends SIGXCPU (its default action ends the process), and
          SIGKILL a second later. A nice value was no fallback: bwrap's
          --new-session gives the program a session, so an autogroup, of its
          own, where a nice value weighs only against its own processes.

The standard library and config only: the supervisor imports this.
"""

from __future__ import annotations

import math
import os
import re
import resource
import signal
from collections.abc import Callable
from typing import NamedTuple

from ..config import CONTROLLERS, Limits

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .cgroups import Place

NAMES = tuple(CONTROLLERS)  # memory, tasks, cpu
NPROC_BY_NAMESPACE = (5, 14)  # the first Linux that counts RLIMIT_NPROC per user namespace

# How a limit holds, as the answer's structured value says it.
PER_CALL, PER_PROCESS, NOT_HELD = "per call", "per process", "no"

# What a program prints when its allocation or its fork was refused, looked
# for in the kept start and end of its errors (of its output when its errors
# are empty: `2>&1`), or in the last SIGNS_IN bytes of a background
# command's one stream: cheap, and enough to say which limit it likely met.
_SIGNS = {
    "memory": (b"MemoryError", b"Cannot allocate memory", b"out of memory", b"Out of memory",
               b"allocation failed", b"bad_alloc", b"memory exhausted"),
    "tasks": (b"Resource temporarily unavailable", b"Cannot fork", b"can't fork", b"fork: retry",
              b"can't start new thread", b"unable to create native thread", b"failed to spawn thread"),
}
# A write past the largest file a program may write, in the words of whoever failed it: EFBIG as Python says it
# (it ignores SIGXFSZ), as Node says it, as the C tools say a write failed with it; a shell's report of SIGXFSZ.
# Not "File too large" alone: an upload server says it of its own limit (multer's LIMIT_FILE_SIZE).
FILE_SIGNS = re.compile(rb"\[Errno 27\] File too large|EFBIG|(?:write error|error writing)[^\n]*: File too large"
                        rb"|File size limit exceeded")
SIGNS_IN = 16384  # bytes of a background command's output's end looked into

_RESOURCES = {"memory": resource.RLIMIT_DATA, "tasks": resource.RLIMIT_NPROC}


class Holding(NamedTuple):
    """How each of a call's limits holds here: through its cgroup, through an
    rlimit inside its sandbox, or not at all."""

    limits: Limits
    by_cgroup: tuple[str, ...] = ()  # names: memory, tasks, cpu
    by_rlimit: tuple[str, ...] = ()
    not_held: tuple[str, ...] = ()
    longest: int | None = None  # seconds a launch may run: the span of the cpu rlimit

    def holds(self, name: str) -> str:
        if name in self.by_cgroup or name == "tasks" and name in self.by_rlimit:
            return PER_CALL
        return PER_PROCESS if name in self.by_rlimit else NOT_HELD

    @property
    def cpu_seconds(self) -> int:
        """The cpu rlimit: the CPU time the cap allows one process over the longest run."""
        assert self.limits.cpu is not None and self.longest is not None  # only a cpu held by rlimit asks
        seconds = max(1, math.ceil(self.limits.cpu * self.longest / 100))
        return _within_hard(resource.RLIMIT_CPU, seconds, seconds)[0]

    def at_most(self, name: str) -> int:
        """The limit `name` as it holds: an rlimit is never above this process's hard limit (cpu: its percent)."""
        value = int(getattr(self.limits, name))
        if name in self.by_rlimit and name in _RESOURCES:
            return _within_hard(_RESOURCES[name], value, value)[0]
        return value

    def rlimits(self) -> tuple[tuple[int, int, int], ...]:
        """(resource, soft, hard) to set on the sandbox's init for the limits no cgroup holds,
        each within this process's hard limit, which the init has (raising it needs a privilege)."""
        return tuple((which, *_within_hard(which, soft, hard)) for which, soft, hard in self._wanted())

    def _wanted(self) -> list[tuple[int, int, int]]:
        found: list[tuple[int, int, int]] = []
        if "memory" in self.by_rlimit and self.limits.memory is not None:
            found.append((resource.RLIMIT_DATA, self.limits.memory, self.limits.memory))
        if "tasks" in self.by_rlimit and self.limits.tasks is not None:
            found.append((resource.RLIMIT_NPROC, self.limits.tasks, self.limits.tasks))
        if "cpu" in self.by_rlimit:
            # A second between: SIGXCPU at the soft limit says which limit bit, SIGKILL ends one that ignores it.
            found.append((resource.RLIMIT_CPU, self.cpu_seconds, self.cpu_seconds + 1))
        return found

    def with_rlimits(self, given: tuple[tuple[int, int, int], ...]) -> tuple[tuple[int, int, int], ...]:
        """`given` (resource, soft, hard) with this call's rlimits: the lower of two for one resource
        (the fork-bomb brake and the task limit are both RLIMIT_NPROC)."""
        lowest: dict[int, tuple[int, int]] = {}
        for which, soft, hard in given + self.rlimits():
            before = lowest.get(which)
            lowest[which] = (soft, hard) if before is None else (min(before[0], soft), min(before[1], hard))
        return tuple((which, soft, hard) for which, (soft, hard) in lowest.items())

    def structured(self) -> dict[str, dict[str, object]]:
        """For the answer's structured value: each limit set, its value, and how it holds here."""
        return {name: {"at_most": self.at_most(name), "holds": self.holds(name)}
                for name in NAMES if getattr(self.limits, name) is not None}


def _within_hard(which: int, soft: int, hard: int) -> tuple[int, int]:
    current = resource.getrlimit(which)[1]
    if current == resource.RLIM_INFINITY:
        return soft, hard
    return min(soft, current), min(hard, current)


def _nproc_by_namespace(release: str) -> bool:
    numbers = [int(part) for part in release.split("-")[0].split(".")[:2] if part.isdigit()]
    return len(numbers) == 2 and tuple(numbers) >= NPROC_BY_NAMESPACE


def _unheld(name: str, euid: int, release: str, longest: int | None) -> bool:
    """Whether no rlimit can stand in for the cgroup: tasks for root, or where the count is the host's; cpu without a span."""
    if name == "tasks":
        return euid == 0 or not _nproc_by_namespace(release)
    return name == "cpu" and longest is None


def holding(limits: Limits, place: Place, longest: int | None, euid: int | None = None,
            release: str | None = None) -> Holding:
    """Which of `limits` hold here and how, for a launch that runs at most `longest` seconds."""
    euid = os.geteuid() if euid is None else euid
    release = os.uname().release if release is None else release
    by_cgroup, by_rlimit, not_held = [], [], []
    for name in NAMES:
        if getattr(limits, name) is None:
            continue
        if CONTROLLERS[name] in place.folders:
            by_cgroup.append(name)
        elif _unheld(name, euid, release, longest):
            not_held.append(name)
        else:
            by_rlimit.append(name)
    return Holding(limits, tuple(by_cgroup), tuple(by_rlimit), tuple(not_held), longest)


def bitten(held: Holding | None, exit_status: int | None, signal_number: int | None, errors: bytes) -> str | None:
    """The limit held by an rlimit that a call ended on, where it can be known:
    "file" when SIGXFSZ ended it or its errors show a write refused past the
    largest file it may write (an rlimit in every sandbox, limits or none);
    "cpu" when SIGXCPU ended it (through bwrap: exit 128+SIGXCPU); "memory" or
    "tasks" when it failed and its errors show an allocation or a fork refused."""
    def ended_by(number: int) -> bool:
        return signal_number == number or exit_status == 128 + number

    by_rlimit = held.by_rlimit if held is not None else ()
    if ended_by(signal.SIGXFSZ):
        return "file"
    if "cpu" in by_rlimit and ended_by(signal.SIGXCPU):
        return "cpu"
    if exit_status == 0 and signal_number is None:
        return None
    if FILE_SIGNS.search(errors):
        return "file"
    for name in ("memory", "tasks"):
        if name in by_rlimit and any(sign in errors for sign in _SIGNS[name]):
            return name
    return None


def bitten_at_end(held: Holding | None, exit_status: int | None, signal_number: int | None,
                  last: Callable[[int], bytes]) -> str | None:
    """`bitten`, for a background command: its output is one stream, in a
    file, whose `last` SIGNS_IN bytes hold what a refusal printed."""
    if exit_status == 0 and signal_number is None:
        return None
    return bitten(held, exit_status, signal_number, last(SIGNS_IN))

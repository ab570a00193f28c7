"""Per-call limits: each call, and each background command, in a cgroup of its own.

A group is made for one launch under this process's own group (serve's, or
a supervisor's, which is serve's), never at a hierarchy's root itself, and
holds the call's limits: memory, tasks and a CPU cap. The call joins it
before bwrap runs, so everything the call starts is in it and nothing of
serve's is: in v1 the spawning thread joins the group for the spawn and
leaves it (`Group.spawning`); in v2, which groups whole processes, a small
`sh` in front of the argv joins it (launch.py). The group ends the call as a
whole (`cgroup.kill` in v2; every member in v1), says which limit bit, and
is removed once its members are gone.

Where a group can be made:
  - cgroup v2, where our own group offers the controllers and we may write
    it: a delegated subtree (`systemd-run --user --scope -p Delegate=yes`),
    or root. A v2 group with processes cannot hand controllers to its
    children, so serve first moves itself into a leaf of its own (`LEAF`),
    as systemd's delegation documents; a supervisor, born in that leaf,
    makes its groups beside it.
  - cgroup v1, for each controller, where we may make a group in ours: root,
    or a subtree root made and handed to this user.

The standard library and config only: the supervisor imports this.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import select
import signal
import threading
import time
from collections.abc import Iterator
from typing import NamedTuple

from ..config import CONTROLLERS, Limits
from ..kernel import HeldFiles, process_stat, read_small

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..state.records import CgroupRecord

LEAF = "lnk-serve"  # v2: where serve moves itself so that its group may have children with controllers
CPU_PERIOD = 100_000  # microseconds
_counter = itertools.count(1)


class Place(NamedTuple):
    """Where this process may make groups: the folder for each controller it
    can have, and why it cannot have the others."""

    version: int  # 2 or 1; 0 when none can be had
    folders: dict[str, str]  # controller -> the folder groups are made in
    missing: dict[str, str]  # controller -> why it cannot be had here
    leaf: str | None = None  # v2: the leaf serve moves into before it makes the first group

    def holds(self, limits: Limits) -> tuple[str, ...]:
        """The controllers of `limits` that hold here."""
        return tuple(c for c in limits.controllers() if c in self.folders)


# -- where -------------------------------------------------------------------


def _unescape(path: str) -> str:
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mounts(mountinfo: str = "/proc/self/mountinfo") -> tuple[str | None, dict[str, tuple[str, str]]]:
    """The v2 mount point, and each v1 controller's (mount point, mount root)."""
    v2: str | None = None
    v1: dict[str, tuple[str, str]] = {}
    with open(mountinfo) as f:
        for line in f:
            before, _, after = line.partition(" - ")
            fields, tail = before.split(), after.split()
            if len(fields) < 5 or len(tail) < 3:
                continue
            root, point = _unescape(fields[3]), _unescape(fields[4])
            if tail[0] == "cgroup2" and v2 is None and root == "/":
                v2 = point
            elif tail[0] == "cgroup":
                for option in tail[2].split(","):
                    v1.setdefault(option, (point, root))
    return v2, v1


def own_groups(cgroup: str = "/proc/self/cgroup") -> tuple[str | None, dict[str, str]]:
    """Our own v2 group, and our own group in each v1 controller's hierarchy."""
    v2: str | None = None
    v1: dict[str, str] = {}
    with open(cgroup) as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if not controllers:
                v2 = path
            for controller in controllers.split(","):
                if controller:
                    v1[controller] = path
    return v2, v1


def _below(point: str, root: str, path: str) -> str | None:
    """The folder of group `path` in a mount of the hierarchy's `root` at `point`; None if not shown."""
    if root != "/" and path != root and not path.startswith(root.rstrip("/") + "/"):
        return None
    relative = os.path.relpath(path, root)
    return point if relative == "." else os.path.join(point, relative)


def _listed(folder: str) -> list[int]:
    """The processes in one folder of a group."""
    return [int(pid) for pid in _read(os.path.join(folder, "cgroup.procs")).split()]


def _read(path: str) -> str:
    """A cgroup file's text ("" when it cannot be read)."""
    return (read_small(path) or b"").decode()


@functools.cache
def place() -> Place:
    """Where this process makes its groups (read once: serve and supervisors never move but into LEAF)."""
    return find()


def find(wanted: tuple[str, ...] = tuple(CONTROLLERS.values())) -> Place:
    """Look, change nothing: v2 when our own group there offers every wanted
    controller and may be written; else v1, controller by controller."""
    v2_point, v1_mounts = mounts()
    v2_path, v1_paths = own_groups()
    why_v2 = "no cgroup v2 hierarchy is mounted"
    if v2_point is not None and v2_path is not None:
        own = os.path.normpath(v2_point + v2_path)
        leaf = None
        if os.path.basename(own) == LEAF:  # a supervisor, born in serve's leaf
            own = os.path.dirname(own)
        offered = _read(os.path.join(own, "cgroup.controllers")).split()
        enabled = _read(os.path.join(own, "cgroup.subtree_control")).split()
        if v2_path == "/" and not set(wanted) <= set(enabled):
            why_v2 = "this process is at the root of cgroup v2, where it makes no group of its own"
        elif not set(wanted) <= set(offered):
            lacking = [c for c in wanted if c not in offered]
            why_v2 = (f"its cgroup v2 group offers no {', '.join(lacking)} controller "
                      "(not delegated to it, or bound to cgroup v1)")
        elif not (os.access(own, os.W_OK) and os.access(os.path.join(own, "cgroup.subtree_control"), os.W_OK)):
            why_v2 = "its cgroup v2 group was not delegated to this user"
        else:
            if not set(wanted) <= set(enabled):
                leaf = os.path.join(own, LEAF)
            return Place(2, {c: own for c in wanted}, {}, leaf)
    folders, missing = {}, {}
    for controller in wanted:
        if controller not in v1_mounts or controller not in v1_paths:
            missing[controller] = f"no cgroup v1 {controller} controller is mounted, and {why_v2}"
            continue
        point, root = v1_mounts[controller]
        group = _below(point, root, v1_paths[controller])
        if group is None:
            missing[controller] = f"its cgroup v1 {controller} group is not shown here (a container), and {why_v2}"
        elif not os.access(group, os.W_OK):
            missing[controller] = (f"its cgroup v1 {controller} group ({group}) is writable only by root, "
                                   f"and {why_v2}")
        else:
            folders[controller] = group
    return Place(1 if folders else 0, folders, missing)


def _enter_leaf(leaf: str) -> None:
    """v2: move this process (and whoever shares its group) into LEAF, then
    let the group hand its controllers to its children."""
    own = os.path.dirname(leaf)
    os.makedirs(leaf, exist_ok=True)
    _write(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
    controllers = " ".join(f"+{c}" for c in CONTROLLERS.values())
    try:
        _write(os.path.join(own, "cgroup.subtree_control"), controllers)
    except OSError:  # EBUSY: others share our group; they move with us
        for pid in _read(os.path.join(own, "cgroup.procs")).split():
            try:
                _write(os.path.join(leaf, "cgroup.procs"), pid)
            except OSError:
                pass  # ended meanwhile
        _write(os.path.join(own, "cgroup.subtree_control"), controllers)


_leaf_lock = threading.Lock()
_in_leaf: set[str] = set()


# -- a group -------------------------------------------------------------------


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


class Group:
    """One call's group: a folder in each hierarchy it joins (one in v2). Each
    group is itself: held in sets by identity."""

    def __init__(self, version: int, folders: tuple[str, ...], limits: Limits, seen: tuple[int, int] = (0, 0)) -> None:
        self.version = version
        self.folders = folders
        self.limits = limits
        self.seen = seen  # its out-of-memory kills and refused forks when its last call ended
        self._counters = HeldFiles()  # its counters: read after each of its calls

    @property
    def procs(self) -> list[str]:
        """The files the call writes its pid to, to join."""
        return [os.path.join(folder, "cgroup.procs") for folder in self.folders]

    @property
    def tasks(self) -> list[str]:
        """v1: the files a thread writes "0" to, to join alone (`spawning`)."""
        return [os.path.join(folder, "tasks") for folder in self.folders]

    def as_record(self) -> CgroupRecord:
        return {"version": self.version, "folders": list(self.folders)}

    @classmethod
    def of_record(cls, value: CgroupRecord) -> Group:
        return cls(int(value["version"]), tuple(value["folders"]), Limits())

    def limit_hit(self) -> str | None:
        """"memory" when its out-of-memory killer killed in it, "tasks" when a
        fork was refused at its task limit, else None: since the last look,
        as a group kept for the next call counts on (keptgroups.py)."""
        before, self.seen = self.seen, self._counts()
        if self.seen[0] > before[0]:
            return "memory"
        if self.seen[1] > before[1]:
            return "tasks"
        return None

    def _counts(self) -> tuple[int, int]:
        kills = refused = 0
        for folder in self.folders:
            if self.version == 2:
                events = self._counters.read(os.path.join(folder, "memory.events"))
                kills += _counted(events, "oom_kill") + _counted(events, "oom_group_kill")
            else:
                kills += _counted(self._counters.read(os.path.join(folder, "memory.oom_control")), "oom_kill")
            refused += _counted(self._counters.read(os.path.join(folder, "pids.events")), "max")
        return kills, refused

    @contextlib.contextmanager
    def spawning(self) -> Iterator[None]:
        """v1: this thread joins the group while it spawns, so that the child is
        born in it (a fork takes its thread's groups), then goes back to its
        own: no exec on the way. v1 groups its tasks by thread; v2 does not.

        The thread writes "0", not its id: the kernel moves the current thread
        alone without its global migration lock, whose writer otherwise waits
        for an RCU grace period (some 6 ms for both moves, against 0.2 ms)."""
        joined: list[str] = []
        try:
            for folder, tasks in zip(self.folders, self.tasks, strict=True):
                _write(tasks, "0")
                joined.append(folder)
            yield
        finally:
            for folder in joined:
                _write(os.path.join(os.path.dirname(folder), "tasks"), "0")  # our own group: the parent

    def members(self) -> list[int]:
        pids: set[int] = set()
        for folder in self.folders:
            pids.update(_listed(folder))
        return sorted(pids)

    def wait_empty(self, wait: float) -> bool:
        """Whether the group is empty, once its members ended (each waited
        for by a pidfd) or `wait` seconds passed. One folder is listed, not
        each: in v1 every member is in all of them (born there, `spawning`;
        a sandbox has no cgroup files to move it by), and the kernel builds
        each folder's list afresh (one list rather than v1's three took the
        kept groups' thread from 0.2 ms a call to 0.11)."""
        deadline = time.monotonic() + wait
        while pids := _listed(self.folders[0]):
            for pid in pids:
                try:
                    pidfd = os.pidfd_open(pid)
                except OSError:
                    continue  # ended already
                try:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([pidfd], [], [], left)[0]:
                        return False
                finally:
                    os.close(pidfd)
        return True

    def kill(self) -> None:
        """SIGKILL to every member: at once in v2, member by member in v1 (each
        held by a pidfd and checked to be ours still, so a reused pid is spared)."""
        if self.version == 2:
            try:
                _write(os.path.join(self.folders[0], "cgroup.kill"), "1")
                return
            except OSError:
                pass  # before Linux 5.14: one by one
        signalled: set[int] = set()
        for _ in range(64):  # a member forking meanwhile is caught on the next round
            fresh = [pid for pid in self.members() if pid not in signalled]
            if not fresh:  # the rest are dying: a killed process forks no more
                return
            for pid in fresh:
                _kill_member(pid, self.folders)
            signalled.update(fresh)

    def remove(self, wait: float = 5.0) -> bool:
        """Kill what is left, then remove each folder once its members are gone
        (they take a few milliseconds to leave after SIGKILL)."""
        self._counters.close()
        deadline = time.monotonic() + wait
        left = list(self.folders)
        while True:
            self.kill()
            for folder in list(left):
                try:
                    os.rmdir(folder)
                    left.remove(folder)
                except FileNotFoundError:
                    left.remove(folder)
                except OSError:
                    pass  # busy: members still leaving
            if not left or time.monotonic() >= deadline:
                return not left
            time.sleep(0.002)


def _counted(text: str, key: str) -> int:
    """The value of `key` in a kernel file of `key value` lines (0 when it has none)."""
    for line in text.splitlines():
        field, _, value = line.partition(" ")
        if field == key:
            return int(value)
    return 0


def _kill_member(pid: int, folders: tuple[str, ...]) -> None:
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return  # gone already
    try:
        name = "/" + os.path.basename(folders[0])  # the same in each hierarchy, and ours alone
        if any(line.endswith(name) for line in _read(f"/proc/{pid}/cgroup").splitlines()):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(pidfd)


def make(limits: Limits, name: str | None = None, where: Place | None = None) -> Group | None:
    """A new group with `limits`, in each hierarchy that holds one of them; None
    when none holds here. Raises OSError when a group cannot be made or
    limited (nothing is left then)."""
    where = where if where is not None else place()
    controllers = where.holds(limits)
    if not controllers:
        return None
    if where.leaf is not None and where.leaf not in _in_leaf:
        with _leaf_lock:
            if where.leaf not in _in_leaf:
                _enter_leaf(where.leaf)
                _in_leaf.add(where.leaf)
    name = name or f"lnk-{os.getpid()}-{next(_counter)}"
    parents = list(dict.fromkeys(where.folders[c] for c in controllers))
    for parent in parents:
        if parent not in _swept:
            _swept.add(parent)
            end_orphans(parent, where.version)
    group = Group(where.version, (), limits)
    try:
        for parent in parents:
            folder = os.path.join(parent, name)
            os.mkdir(folder, 0o755)
            group.folders += (folder,)
        for controller in controllers:
            folder = os.path.join(where.folders[controller], name)
            for file, value in _settings(where.version, controller, limits, folder):
                _write(os.path.join(folder, file), value)
    except BaseException:
        group.remove(wait=1.0)
        raise
    return group


_swept: set[str] = set()
_OURS = re.compile(r"lnk-(\d+)-\d+")


def end_orphans(parent: str, version: int) -> int:
    """End the groups a process that is gone made here (a serve killed
    outright while a call ran: its call's sandbox may live on in the group),
    and remove them. Once per process and folder, at its first group."""
    ended = 0
    for name in os.listdir(parent):
        match = _OURS.fullmatch(name)
        if match and not _alive(int(match[1])):
            Group(version, (os.path.join(parent, name),), Limits()).remove(wait=0.5)
            ended += 1
    return ended


def _alive(pid: int) -> bool:
    """Whether the maker runs. A zombie does not: a supervisor killed outright is nobody's child that
    waits, and its reaper may reap on a timer (a container's init: seconds), past the next group's look."""
    try:
        os.kill(pid, 0)
        fields = process_stat(pid)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's, or hidden from us: left alone
    return fields is not None and fields[0] != b"Z"  # None: reaped between the two looks


def _settings(version: int, controller: str, limits: Limits, folder: str) -> list[tuple[str, str]]:
    if controller == "memory":
        memory = str(limits.memory)
        if version == 2:
            extra = [("memory.swap.max", "0")] if os.path.exists(os.path.join(folder, "memory.swap.max")) else []
            return [("memory.max", memory), ("memory.oom.group", "1")] + extra
        # memory+swap as well where swap is counted, so that a limit is not swap's to stretch
        extra = ([("memory.memsw.limit_in_bytes", memory)]
                 if os.path.exists(os.path.join(folder, "memory.memsw.limit_in_bytes")) else [])
        return [("memory.limit_in_bytes", memory)] + extra
    if controller == "pids":
        return [("pids.max", str(limits.tasks))]
    assert limits.cpu is not None  # only a limit given names its controller
    quota = max(1000, limits.cpu * CPU_PERIOD // 100)
    if version == 2:
        return [("cpu.max", f"{quota} {CPU_PERIOD}")]
    return [("cpu.cfs_period_us", str(CPU_PERIOD)), ("cpu.cfs_quota_us", str(quota))]

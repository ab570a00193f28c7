"""Serve's cgroups between calls: a group its call left empty kept for the
next call with the same limits, the next call's group made ahead, and each
ended group kept or removed off the answer's path.

mkdir and the limits' files cost some 0.6 ms for three controllers, and
removing a group as much: a call takes a kept group. One thread, made at the
first ended group, keeps or removes them one after another (no thread is
made on a call's path). `close()`, at serve's end, removes every group made
or kept; a serve killed outright leaves its groups to the next serve's
`cgroups.end_orphans`, like any group of a process that is gone.

Made once by serve's owner of calls (calls/caller.py), which hands it to
the sandbox (`Sandbox.groups`: a launch takes its group here) and to the
runner (a call's group ended here). A supervisor keeps no group: it makes
its command's with `cgroups.make`.
"""

from __future__ import annotations

import queue
import threading

from .. import logger
from ..config import Limits
from .cgroups import Group, make

KEEP = 32  # the most empty groups kept per limits: as many calls as ran at once, within reason


class KeptGroups:
    """Serve's calls' cgroups: those kept empty for the next call, and those ended and not yet kept or removed."""

    def __init__(self) -> None:
        self._kept: dict[Limits, list[Group]] = {}
        self._pending: set[Group] = set()  # ended, not yet kept or removed: close() removes them
        self._lock = threading.Lock()
        self._closed = threading.Event()  # set at close: no group is made ahead or kept any more
        self._ended: queue.SimpleQueue[Group] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def take(self, limits: Limits) -> Group | None:
        """A group for one launch: a kept one for these limits, else a new one (as `cgroups.make`)."""
        with self._lock:
            kept = self._kept.get(limits)
            group = kept.pop() if kept else None
        return group if group is not None else make(limits)

    def ended(self, group: Group) -> None:
        """After its call (`limit_hit` read first: the next call counts on from
        there): kept for the next call once its members left (they take
        milliseconds), else removed; off the answer's path."""
        with self._lock:
            self._pending.add(group)
            if self._thread is None:
                self._thread = threading.Thread(target=self._keep_or_remove, daemon=True, name="cgroups")
                self._thread.start()
        self._ended.put(group)

    def close(self) -> None:
        """At serve's end: no group is made ahead or kept any more, and those made, kept or ended are removed."""
        with self._lock:
            self._closed.set()
            groups = [group for kept in self._kept.values() for group in kept] + list(self._pending)
            self._kept.clear()
            self._pending.clear()
        for group in groups:
            group.remove(wait=1.0)

    def _keep_or_remove(self) -> None:
        while True:
            group = self._ended.get()
            try:
                if not self._give_back(group):  # kept for the next call: no group to make
                    group.remove()
                    self._make_ahead(group.limits)
            except Exception as problem:  # a bug of ours: said, and the next groups are still removed
                logger.error(f"cannot remove a call's cgroup: {problem!r}")
            with self._lock:
                self._pending.discard(group)

    def _give_back(self, group: Group, wait: float = 5.0) -> bool:
        """True when the group is kept for the next call with its limits, which
        it is once nothing is left in it (the sandbox's init takes some
        milliseconds to end after its call: waited for, up to `wait` seconds)."""
        if not group.wait_empty(wait):
            return False
        with self._lock:
            kept = self._kept.setdefault(group.limits, [])
            if self._closed.is_set() or len(kept) >= KEEP:
                return False
            kept.append(group)
        return True

    def _make_ahead(self, limits: Limits) -> None:
        """Make the next call's group now, unless one is kept. A group that
        cannot be made is left to the next call, which says why."""
        with self._lock:
            if self._closed.is_set() or self._kept.get(limits):
                return
        try:
            group = make(limits)
        except OSError:
            return
        if group is None:
            return
        with self._lock:
            if not self._closed.is_set() and not self._kept.get(limits):
                self._kept[limits] = [group]
                return
        group.remove(wait=1.0)

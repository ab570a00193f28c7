"""Admission of a background command (step 1): the caps, under the state
folder's start lock, and the `starts` file that counts the day's starts.

A start holds `start.lock` from its check of the caps until its supervisor is
spawned, so two serves of one agent never both take the last place.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from ..state import filing, layout, records
from ..errors import Refused
from ..invocation import typed
from ..units import local_time

START_LOCK_WAIT = 5.0
DAY = 86400
STARTS_KEPT = 64 * 1024  # bytes of `starts` past which its old lines are dropped


@contextlib.contextmanager
def start_lock(state: str) -> Iterator[None]:
    """The state folder's start lock, held while the block runs; it names its holder."""
    path = os.path.join(state, layout.START_LOCK)
    try:
        with filing.hold(path, wait=START_LOCK_WAIT) as fd:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            yield
    except filing.Held:
        raise Refused(f"the state folder's start lock is held by process {_holder(path)} for over "
                      f"{START_LOCK_WAIT:.0f} s", "try again; if it stays, that process is stuck") from None


def _holder(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(32).decode(errors="replace").strip() or "another process"
    except OSError:
        return "another process"


def check_caps(state: str, running_cap: int, per_day: int) -> None:
    """1. What runs against --background, the day's starts against --background-per-day."""
    running = len(records.running_ids(state))
    if running >= running_cap:
        # They outlive the client that started them: a session gone, or another
        # conversation, may hold every place, and list shows this conversation's alone.
        raise Refused(f"{running} background commands of this agent run already, its conversations' together, "
                      "the most at once",
                      "a place frees up when one ends: wait for one, or stop one (list shows this conversation's); "
                      f"they outlive the client that started them, and {typed(f'stop --state {state}')} "
                      "in a terminal stops every one")
    starts = starts_since(state, records.now() - DAY)
    if len(starts) >= per_day:
        frees = local_time(min(starts) + DAY)
        raise Refused(f"{len(starts)} background commands started in the last 24 hours, the most in a day",
                      f"a place frees up at {frees}")


def count_start(state: str, when: float) -> int:
    """Append a start to `starts` (under start.lock); returns the file's
    size before it, for `uncount_start`. Now and then the lines older
    than a day are dropped first, so the file stays small."""
    path = os.path.join(state, layout.STARTS)
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        size = 0
    if size > STARTS_KEPT:
        recent = starts_since(state, records.now() - DAY)
        filing.write_whole(path, "".join(f"{t:.3f}\n" for t in recent).encode())
    with open(path, "a") as f:
        before = f.tell()
        f.write(f"{when:.3f}\n")
    return before


def uncount_start(state: str, before: int) -> None:
    """Take back the start `count_start` just added (still under start.lock):
    a spawn that failed ran nothing."""
    os.truncate(os.path.join(state, layout.STARTS), before)


def starts_since(state: str, since: float) -> list[float]:
    """The starts after `since` (the caller holds start.lock). A start dated
    in the future was written while the wall clock was ahead: it is dated
    now the first time it is seen, in the file too, and ages from then (at
    each check as now, it would hold its place until the clock reached it)."""
    path = os.path.join(state, layout.STARTS)
    now = records.now()
    try:
        with open(path) as f:
            times = [float(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
    except ValueError:
        times = []
    if any(t > now for t in times):
        times = [min(t, now) for t in times]
        with contextlib.suppress(OSError):  # a full state folder: as now again at the next check
            filing.write_whole(path, "".join(f"{t:.3f}\n" for t in times).encode())
    return [t for t in times if t > since]

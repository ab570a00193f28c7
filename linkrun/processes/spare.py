"""A sandbox made before its call: bubblewrap's set-up off the call's path.

Setting up a sandbox (its namespaces, a mount per bind, its filter) is
most of what a short call costs. So serve keeps sandboxes made ahead (AHEAD
of them; after calls at once, as many as ran at once, for a while:
`Spares`), made from its start and again as calls take them, by MAKERS
threads, one fewer at once for each call running: bwrap runs LOADER, a
small `sh` that waits on its standard input for the call's program. The call writes a
script there (`script`): into the call's folder, the shell's own variables
dropped, `exec` of the program; and reads the loader's ACK before the
program's output (`Spare.hand_over`), so a spare killed from outside before
it read the script is known, and the call makes its own sandbox. What the program then finds (its
environment, descriptors, folder, limits, cgroup, namespaces) is what a
sandbox made for it would give it.

A spare is made from the files folder's state at its making, so a call
takes it only when a sandbox made for the call would show the same things:
`Launch.key` names each bound folder and file by its identity (a folder
renamed, a repository made since, a rebuilt /etc view, another proxy all
change it). Otherwise the spare ends, off the call's path, and the call
gets a sandbox made for it. At most one call waits for a spare being made
(for its key, or one not known yet): it started earlier than a new one
would; the others make their own at once.

The makers are threads that live as long as serve: the thread that spawns
a sandbox is the one its `--die-with-parent` is bound to.
"""

from __future__ import annotations

import functools
import os
import queue
import select
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from .. import logger
from ..errors import Refused
from ..kernel import HeldFiles

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..sandboxing.cgroups import Group
    from ..sandboxing.launch import Launch
    from .group import Leader

# Reads a line count, then that many lines, says so (ACK, on its output,
# which serve reads before the program's), and runs them. `read` takes a
# pipe a byte at a time, so what follows the script stays for the program;
# hence what every script does is here (`clean`, called by it after its
# `cd`: the variables `sh` sets itself dropped), not in the script. A count
# of 0 (a call without input, whose pipe serve closes after the script):
# the script is all the rest, read at once by `.` (through the lines where
# /dev/stdin is missing), and it is one `{ }` group, which the shell parses
# whole before it runs any of it: a script cut short runs nothing.
# bash's exec sets SHLVL again, whatever was unset: env drops it there.
LOADER = ('clean() { unset PWD OLDPWD SHLVL; e=; [ -z "${BASH_VERSION-}" ] || e="/usr/bin/env -u SHLVL"; }; '
          'IFS= read -r n || exit 125; s=; if [ "$n" = 0 ]; then '
          '[ -r /dev/stdin ] && { printf .; . /dev/stdin; exit 125; }; '
          'while IFS= read -r l; do s="$s$l\n"; done; '
          'else while [ "$n" -gt 0 ]; do IFS= read -r l || exit 125; s="$s$l\n"; n=$((n - 1)); done; fi; '
          'printf .; eval "$s"; exit 125')
ACK = b"."
ACK_WAIT = 5.0  # seconds a call waits for a live spare's loader to read its script
LOADER_TAIL = ("/bin/sh", "-c", LOADER)
# `read` costs a syscall a byte (with input): a longer script costs more than the set-up it saves.
SCRIPT_LIMIT = 8192

# bwrap's set-up is CPU work (namespaces, mounts, the filter): makers past
# the cores only queue for them, and more than 4 at once gained nothing.
MAKERS = max(1, min(4, os.cpu_count() or 1))
AHEAD = MAKERS  # spares kept at rest: calls back to back take them as fast as the makers make them
MOST = 16  # spares kept after a burst of calls at once
LINGER = 60.0  # seconds they are kept after it
MAKING_WAIT = 15.0  # seconds serve's end waits for a spare being made (its hand-over may take 10)
# A spare made while another waits is made this much later: serve's answer
# to the call that took one goes out first, not behind the making's Python.
SETTLE = 0.005
QUIET = 5.0  # seconds without spares after one ended before its call
FAILURES_OFF = 3  # spares that ended before their calls, none handed over between: no more spares
_MAKING = object()  # the slot's key while a spare's launch is being prepared


def quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def script(argv: list[str], folder: str, files: str, has_input: bool) -> bytes | None:
    """What the loader runs for `argv` in `folder` (below `files`), counted in
    lines; None when it is over SCRIPT_LIMIT. The variables `sh` sets itself
    go: the program gets the sandbox's environment as it was given."""
    folder = folder.strip("/")
    text = f"cd -- {quote(f'{files}/{folder}')} || exit 125\n" if folder not in ("", ".") else ""
    text += "clean\nexec " + ("" if has_input else "0<>/dev/null ") + "$e "  # /dev/null as subprocess opens it
    text += " ".join(quote(arg) for arg in argv)
    if has_input:
        data = f"{text.count(chr(10)) + 1}\n{text}\n".encode(errors="surrogateescape")
    else:  # the rest of the pipe, in one group (LOADER)
        data = f"0\n{{ {text}\n}}\n".encode(errors="surrogateescape")
    return data if len(data) <= SCRIPT_LIMIT else None


@dataclass
class Spare:
    """A sandbox whose loader waits for a program; its init and its cgroup held."""

    key: Hashable
    launch: Launch  # held until the spare's sandbox ended: its /etc view pinned, bwrap's info pipe read
    leader: Leader
    group: Group | None
    # /proc/<pid>/status of its bwrap and its init, opened as it is made (off
    # the call's path), each descriptor bound to that process (never to
    # another given its pid later): read at its take (`running`).
    statuses: tuple[str, ...] = field(init=False)
    held: HeldFiles = field(init=False, default_factory=HeldFiles)

    def __post_init__(self) -> None:
        self.statuses = tuple(f"/proc/{pid}/status" for pid in (self.leader.process.pid, self.launch.init_pid)
                              if pid is not None)
        for status in self.statuses:
            self.held.hold(status)

    def close(self) -> None:
        """Once its sandbox ended: what it holds let go."""
        self.held.close()
        self.launch.close()

    def running(self) -> bool:
        """Its bwrap and its init run still: neither pidfd is readable
        (held, their pids are not another's yet), and neither has a SIGKILL
        pending (sent from outside a moment ago: it has not ended yet, but will
        as soon as it runs, and its sandbox with it). The loader's end is seen
        at the hand-over, which waits for its word."""
        held = [fd for fd in (self.leader.pidfd, self.leader.sandbox_init) if fd is not None]
        if self.leader.pidfd is None or select.select(held, [], [], 0)[0]:
            return False
        return not any(_kill_pending(self.held.read(status)) for status in self.statuses)

    def hand_over(self, data: bytes, has_input: bool) -> bool:
        """The script written to the loader; True once the loader said it
        read it all (ACK), so the program runs. False when the spare ended
        first (killed from outside: its loader, init or bwrap) or did not
        answer within ACK_WAIT: nothing of the call ran, and the caller ends
        the spare and makes the call a sandbox of its own. The input pipe has
        room for `data` (at most SCRIPT_LIMIT)."""
        process = self.leader.process
        assert process.stdin is not None and process.stdout is not None  # a spare's are pipes
        try:
            process.stdin.write(data)
            process.stdin.flush()
        except OSError:  # every reader gone: the spare ended
            return False
        if not has_input:
            process.stdin.close()
        out = process.stdout.fileno()
        waits = [fd for fd in (out, self.leader.pidfd, self.leader.sandbox_init) if fd is not None]
        if not select.select(waits, [], [], ACK_WAIT)[0] or not select.select([out], [], [], 0)[0]:
            return False  # no word in time, or an end (the bwrap's or its init's) before any
        return os.read(out, 1) == ACK  # the loader's first byte: end of file when it died before it


class NotNow(Exception):
    """No spare can be made now (the agent's proxy does not run, or did not listen in it): the next call's try again."""


_SIGKILL_BIT = 1 << (9 - 1)  # SIGKILL in /proc's pending masks


def _kill_pending(status: str) -> bool:
    """SIGKILL is pending for the process whose `status` this is (for it, or
    for its process as a whole), or it is gone (its status empty). The two
    lines are found, not every line split: on the call's path."""
    if not status:
        return True
    for name in ("\nSigPnd:", "\nShdPnd:"):
        at = status.find(name)
        if at >= 0 and int(status[at + len(name):status.find("\n", at + 1)], 16) & _SIGKILL_BIT:
            return True
    return False


class Spares:
    """The spares, made by `makers` threads that live as long as serve, one
    fewer at once for each call in flight (at least one).

    `ahead` are kept; after calls at once, as many as ran at once (at most
    MOST), until LINGER seconds pass without so many, so that the next such
    burst finds its sandboxes made. A spare taken is made again after its
    call, or at once, while it runs, when a call alone took the last; while
    another waits, a making settles first (SETTLE). `prepare` gives a spare's launch and its key (run
    on a maker), `start` spawns it, `end` kills and reaps one not taken.
    """

    def __init__(self, prepare: Callable[[], tuple[Launch, Hashable]], start: Callable[[Launch, Hashable], Spare],
                 end: Callable[[Spare], None], ahead: int = AHEAD, makers: int = MAKERS) -> None:
        self._prepare, self._start, self._end = prepare, start, end
        self._ahead, self._makers = ahead, makers
        self._lock = threading.Condition()
        self._ready: list[Spare] = []
        self._making: dict[int, object] = {}  # each making's key, _MAKING before it is known
        self._slots = iter(range(1 << 62))  # the makings' names
        self._in_flight = 0  # calls between take() and done()
        self._wanted, self._wanted_since = ahead, 0.0  # spares to keep, and when a burst last asked for that many
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()  # None: a maker ends
        self._threads = 0  # makers running
        self._made = 0  # spares made so far (or failed): what a waiting call waits to change
        self._waiter = False  # a call waits for the spare being made: the next ones make their own
        self._closed = False
        self._off: str | None = None  # why no more spares are made
        self._failures = 0  # spares that ended before their calls since one was handed over
        self._quiet_until = 0.0  # no spare is made before this (monotonic), after one ended before its call

    @property
    def off(self) -> str | None:
        """Why no spares are made any more, or None while they are."""
        return self._off

    @property
    def ready(self) -> int:
        """How many spares are made and wait for their calls."""
        with self._lock:
            return len(self._ready)

    def take(self, key: Hashable, use: bool = True) -> Spare | None:
        """A spare that shows what a sandbox made now for `key` would; else
        None. Spares that do not are ended off the call's path. Counts the
        call as in flight (`use=False`: only that, for a call that cannot
        use one): the caller calls `done(True)` once it ended."""
        stale: list[Spare] = []
        with self._lock:
            self._in_flight += 1
            if self._in_flight >= self._wanted:
                self._wanted, self._wanted_since = max(self._ahead, min(MOST, self._in_flight)), time.monotonic()
            if not use:
                return None
            if not self._ready and not self._waiter and self._coming(key):
                self._waiter, made = True, self._made
                self._lock.wait_for(lambda: self._made != made or not self._coming(key))
                self._waiter = False
            found = None
            while self._ready and found is None:
                spare = self._ready.pop()
                if spare.key == key and spare.running():
                    found = spare
                else:
                    stale.append(spare)
            if not self._ready:
                self._lock.notify_all()  # a making that settles goes on now
        if not all(spare.running() for spare in stale):
            self._failed()
        if stale:
            self._run(functools.partial(self._end_all, stale))
        if found is not None and not self._ready and self._in_flight == 1:
            # Calls one after another, faster than spares were made: the next
            # made while this one runs. Not in a burst: its calls make their own.
            self.make()
        return found

    def _coming(self, key: Hashable) -> bool:
        """A spare being made may show what `key` names (under the lock)."""
        return any(making in (_MAKING, key) for making in self._making.values())

    def handed(self, spare: Spare, ok: bool) -> None:
        """After a `take`n spare's hand-over: `ok`, the spares' failures are
        forgotten; else it ended before its call, and is ended off the call's path."""
        if ok:
            with self._lock:
                self._failures = 0
            return
        self._failed()
        self._run(functools.partial(self._end_all, [spare]))

    def _failed(self) -> None:
        """A spare ended before its call (killed from outside): none is made
        for QUIET seconds; after FAILURES_OFF in a row, none any more."""
        with self._lock:
            self._failures += 1
            self._quiet_until = time.monotonic() + QUIET
            failures = self._failures
        if failures >= FAILURES_OFF:
            self._turn_off(f"{failures} spare sandboxes in a row ended before their calls")

    def _end_all(self, spares: list[Spare]) -> None:
        for spare in spares:
            self._end(spare)

    def done(self, counted: bool) -> None:
        """A call ended (`counted`: it was counted in `take`): the spares made up again."""
        if counted:
            with self._lock:
                self._in_flight -= 1
        self.make()

    def make(self) -> None:
        """Make spares, as many at once as there are makers less one for each
        call in flight (at least one), until enough are there or on their way."""
        while True:
            with self._lock:
                # A call's program needs a core too: two makings beside a call
                # on two cores held calls back to back at their p99.
                at_once = max(1, self._makers - self._in_flight)
                if (self._closed or self._off or len(self._making) >= at_once
                        or len(self._ready) + len(self._making) >= self._wanted
                        or time.monotonic() < self._quiet_until):
                    return  # after a quiet while, a maker asks again
                slot = next(self._slots)
                self._making[slot] = _MAKING
            self._run(functools.partial(self._make, slot))

    def close(self) -> None:
        """At serve's end: the spares ended, one being made ended once made, and none made any more.

        Waits for one being made: serve's end cuts off a bwrap in its set-up
        (its parent-death signal), and bwrap 0.8's init, made but not yet let
        go by its parent, then waits for it forever."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            self._lock.wait_for(lambda: not self._making, timeout=MAKING_WAIT)
            spares, self._ready = self._ready, []
            threads = self._threads
        self._end_all(spares)
        for _ in range(threads):
            self._jobs.put(None)  # after the jobs queued before: each maker ends

    def _make(self, slot: int) -> None:
        spare = None
        try:
            with self._lock:  # no hurry while one is ready: until a call takes the last
                self._lock.wait_for(lambda: not self._ready or self._closed, timeout=SETTLE)
            if self._off:
                return  # turned off since this making was asked for
            launch, key = self._prepare()
            with self._lock:
                self._making[slot] = key
                self._lock.notify_all()
                closed = self._closed
            try:
                if not closed:
                    spare = self._start(launch, key)
            finally:
                if spare is None:
                    launch.close()
        except (Refused, NotNow):
            pass  # the call will be refused too, and say why; the next call's spare tries again
        except Exception as problem:  # a sandbox that cannot be made ahead: the calls make their own
            self._turn_off(f"cannot make a spare sandbox: {problem}")
        finally:
            with self._lock:
                if spare is not None and not self._closed:
                    self._ready.append(spare)  # taken first, and kept last by _trim
                    spare = None
            if spare is not None:  # closed meanwhile: ended before close() returns
                self._end(spare)
            with self._lock:
                del self._making[slot]
                self._made += 1
                self._lock.notify_all()
        self.make()  # the next, while fewer than wanted

    def _trim(self) -> None:
        """LINGER seconds after the last burst: back to `ahead` spares."""
        with self._lock:
            if self._wanted <= self._ahead or time.monotonic() - self._wanted_since < LINGER or self._in_flight:
                return
            self._wanted = self._ahead
            extra, self._ready = self._ready[:-self._ahead], self._ready[-self._ahead:]
        self._end_all(extra)

    def _idle(self) -> float:
        """How long the thread waits for a job: until a quiet while ends, at most LINGER."""
        with self._lock:
            quiet = self._quiet_until - time.monotonic()
        return min(LINGER, quiet) if quiet > 0 else LINGER

    def _turn_off(self, why: str) -> None:
        with self._lock:
            said, self._off = self._off, self._off or why
        if said is None:
            logger.warning(f"{why}; each call sets up its own sandbox from now on")

    def _run(self, job: Callable[[], None]) -> None:
        with self._lock:
            while self._threads < self._makers and not self._closed:
                self._threads += 1
                threading.Thread(target=self._work, daemon=True, name="spares").start()
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self._idle())
            except queue.Empty:
                job = _nothing  # a quiet while may have ended: spares again
            if job is None:  # serve's end: the spares it spawned are ended, nothing is bound to it
                with self._lock:
                    self._threads -= 1
                return
            try:
                job()
                self._trim()
                self.make()  # nothing when enough are there or on their way, or in a quiet while
            except Exception as problem:  # a bug of ours: said, the spares off, and the maker lives on
                self._turn_off(f"the spares failed: {problem!r}")
                with self._lock:
                    self._made += 1
                    self._lock.notify_all()


def _nothing() -> None:
    pass

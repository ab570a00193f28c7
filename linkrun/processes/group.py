"""One process group watched to its end: the loop a call and a background command share.

A `Watch` polls the leader's pidfd, the output pipes and whatever its side
adds (a call's input, a supervisor's wake pipe). Its deadline runs on
CLOCK_BOOTTIME, looked at at least every SLICE. The leader's exit is read
without reaping it, so the group id stays ours while what the leader left in
its group is killed: at once, or after a grace while it still holds the
pipes; the pipes are then drained until a bound, for something outside the
group may hold them forever. A sandbox's pipes are read as they are at the
exit, and no longer: its init holds them until it is torn down. A stop is
staged: the side's own stages, each with its grace (a call has none), then
SIGKILL to the group.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence

from .child import SLICE, boottime, exit_status, kill_group

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..sandboxing.cgroups import Group as Cgroup

CHUNK = 1 << 20
PIPE_SIZE = 1 << 20
COALESCE = 0.0005  # seconds to let output gather between reads while it trickles
TRICKLE = 16 << 10  # a read smaller than this: the writer writes in small pieces, which a pause gathers


def grow_pipe(fd: int) -> None:
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass  # the default pipe works, with more wake-ups


def kill_init(pidfd: int | None) -> None:
    """SIGKILL a sandbox's init: its pid namespace, and all in it, ends with it."""
    if pidfd is not None:
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass  # ended already


class Leader:
    """A spawned group leader and what dies with it.

    `sandbox_init` may be set after the spawn to a pidfd of the sandbox's
    pid 1 (its init, which bubblewrap reports on --info-fd): it is killed
    with the group, and right after the leader exits, and closed with the
    leader. The leader owns it from then on.

    `cgroup` may be set likewise to the launch's cgroup (cgroups.Group): it
    is killed as a whole with the group, and right after the leader exits
    when no init was set (with one, all of the sandbox is in the init's pid
    namespace, which ends with it). The caller reads and removes it once the
    leader is reaped; the removal kills what is left.
    """

    def __init__(self, process: subprocess.Popen[bytes]) -> None:  # not reaped before close()
        self.process = process
        self.pgid = process.pid
        self.pidfd: int | None = os.pidfd_open(process.pid)
        self.sandbox_init: int | None = None
        self.cgroup: Cgroup | None = None  # when the launch has one
        self.killed = False
        self._lock = threading.Lock()  # kill() may come from a cancelling thread

    def kill(self) -> None:
        """SIGKILL to the group and the sandbox; nothing once closed (the ids may be another's)."""
        with self._lock:
            if self.pidfd is None:
                return
            kill_group(self.pgid)
            self.killed = True
            self._end_sandbox()

    def end_sandbox(self) -> None:
        """At the leader's exit: the sandbox's init goes with it, or without one, all of the call's cgroup."""
        with self._lock:
            if self.pidfd is None:
                return
            if self.sandbox_init is not None:
                kill_init(self.sandbox_init)
            elif self.cgroup is not None:
                self.cgroup.kill()

    def _end_sandbox(self) -> None:
        kill_init(self.sandbox_init)
        if self.cgroup is not None:
            self.cgroup.kill()

    def close(self) -> None:
        with self._lock:
            for fd in (self.pidfd, self.sandbox_init):
                if fd is not None:
                    os.close(fd)
            self.pidfd = self.sandbox_init = None

    def abandon(self) -> None:
        """A sandbox given up before its program's output was watched: killed, reaped, its descriptors closed."""
        process = self.process
        self.kill()
        process.wait()
        self.close()
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass  # a write to the dead loader left unflushed


class Stage:
    """A step of a stop before the SIGKILL: what it is (for the log), its act, and the grace after it."""

    __slots__ = ("what", "act", "grace")

    def __init__(self, what: str, act: Callable[[], None], grace: float) -> None:
        self.what, self.act, self.grace = what, act, grace


class Watch:
    """The loop over one leader until it has exited and its output is drained.

    After `run`, `exit` and `signal` are the leader's ending, `ending` why it
    was stopped ("timed out", or the reason given to `stop`; None when it
    ended by itself), and `leader.killed` whether its group got SIGKILL.
    """

    def __init__(self, leader: Leader, deadline: float, *, stages: Sequence[Stage] = (),
                 leftover_grace: float = 0.0, log: Callable[[str], None] | None = None) -> None:
        if leader.pidfd is None:
            raise ValueError("a closed leader cannot be watched")
        self.leader = leader
        self._pidfd = leader.pidfd
        self.deadline = deadline
        self.stages = stages
        self.leftover_grace = leftover_grace  # how long leftovers may hold the pipes after the exit
        self.log = log
        self.exit: int | None = None
        self.signal: int | None = None
        self.exited_at: float | None = None
        self.ending: str | None = None
        self._stage = 0
        self._stage_at: float | None = None  # when the stop's next step is due
        self._poller = select.poll()
        self._poller.register(self._pidfd, select.POLLIN)
        self._streams: dict[int, Callable[[int], int]] = {}
        self._handlers: dict[int, Callable[[], None]] = {}
        self.answered = False  # a sink told a reader of its output: no pause, it may ask again at once

    @property
    def exited(self) -> bool:
        return self.exited_at is not None

    def drain(self, fd: int, sink: Callable[[int], int]) -> None:
        """Read an output pipe until its end: `sink(fd)` moves what it holds, returning 0 at EOF."""
        grow_pipe(fd)
        self._streams[fd] = sink
        self._poller.register(fd, select.POLLIN)

    def pump_now(self) -> None:
        """What each output pipe holds now, moved by its sink: a look at the program answers after
        what it printed before it went to wait (input.py)."""
        for fd, sink in list(self._streams.items()):
            if select.select([fd], [], [], 0)[0] and not sink(fd):
                self.forget(fd)

    def on_ready(self, fd: int, events: int, handler: Callable[[], None]) -> None:
        self._handlers[fd] = handler
        self._poller.register(fd, events)

    def forget(self, fd: int) -> None:
        self._poller.unregister(fd)
        self._streams.pop(fd, None)
        self._handlers.pop(fd, None)

    def stop(self, reason: str) -> None:
        """Begin the staged stop, once, unless the leader has exited already. From the
        loop's own thread (a tick); another thread kills with `leader.kill()`."""
        if self.ending is None and not self.exited:
            self.ending = reason
            self._stage_at = boottime()
            self._next_stage(self._stage_at, f"stopping ({reason}): ")

    def run(self, tick: Callable[[Watch], float | None] | None = None) -> None:
        """Until the leader has exited and the pipes are drained. `tick(watch)`
        is called at each wake; it may stop the watch, and returns how soon it
        wants the next wake (None: no sooner than otherwise). On any failure
        the group is killed; the leader is closed either way."""
        try:
            while self._streams or not self.exited:
                now = boottime()
                if not self.exited and now >= self.deadline:
                    self.stop("timed out")
                soon = tick(self) if tick is not None else None
                self._next_stage(now)
                self._kill_leftovers(now)
                due = self._leftovers_due()
                if due is not None and now >= due + SLICE:
                    break  # something outside the group holds the pipes: stop reading
                self._poll(self._wake(now, soon))
        except BaseException:
            self.leader.kill()
            raise
        finally:
            self.leader.close()

    def _next_stage(self, now: float, why: str = "") -> None:
        """The stop's steps that are due, each logged in one line naming the group."""
        while self._stage_at is not None and now >= self._stage_at and not self.exited:
            if self._stage < len(self.stages):
                stage = self.stages[self._stage]
                self._stage += 1
                self._say(f"{why}{stage.what}, then SIGKILL to group {self.leader.pgid} in {stage.grace:g} s")
                stage.act()
                self._stage_at = now + stage.grace
            else:
                self._say(f"{why}SIGKILL to group {self.leader.pgid}")
                self.leader.kill()
                self._stage_at = None
            why = ""

    def _kill_leftovers(self, now: float) -> None:
        due = self._leftovers_due()
        if due is not None and not self.leader.killed and now >= due:
            self.leader.kill()  # a leftover still holds the pipes

    def _leftovers_due(self) -> float | None:
        """When leftovers still holding the pipes are killed; None before the exit."""
        return None if self.exited_at is None else self.exited_at + self.leftover_grace

    def _wake(self, now: float, soon: float | None) -> float:
        at = [now + SLICE]
        if not self.exited and self.ending is None:
            at.append(self.deadline)
        if self._stage_at is not None:
            at.append(self._stage_at)
        due = self._leftovers_due()
        if due is not None:
            at.append(due + SLICE if self.leader.killed else due)
        if soon is not None:
            at.append(now + soon)
        return max(0.0, min(at) - now)

    def _poll(self, wake: float) -> None:
        flowing = False
        for fd, _event in self._poller.poll(wake * 1000):
            if fd == self._pidfd:
                self._on_exit()
            elif fd in self._streams:
                moved = self._streams[fd](fd)
                if not moved:
                    self.forget(fd)
                elif moved < TRICKLE:
                    flowing = True
            elif fd in self._handlers:
                self._handlers[fd]()
        if flowing and not self.exited and not self.answered:
            # Let the pipe fill a little before the next wake: a flood written
            # 8 KiB at a time would otherwise wake us for every write. Not
            # after a large read: the writer is fast, and a pause (0.5 ms and
            # the timer's slack) would hold it at a pipe's worth per pause.
            # Nor past the leader's exit: a short program's few bytes and its
            # end come together, and its answer waited the whole pause. Nor
            # right after a write was answered (input.py): serve looks next.
            select.select([self._pidfd], [], [], COALESCE)
        self.answered = False

    def _on_exit(self) -> None:
        self._poller.unregister(self._pidfd)
        self.exit, self.signal = exit_status(self._pidfd)
        self.exited_at = boottime()
        self._stage_at = None
        if self.leader.sandbox_init is not None:
            # All the program wrote is in the pipes now. bwrap's init holds them
            # (its stdio) until its namespaces are torn down, up to a millisecond
            # later, and what the program left dies with it: read what is there.
            self._read_what_is_there()
        self.leader.end_sandbox()  # the sandbox goes with its outer process
        if self.leftover_grace <= 0:
            # What the program left dies with the sandbox's pid namespace;
            # without one (a pass-through sandbox), with its group, now.
            self.leader.kill()

    def _read_what_is_there(self) -> None:
        """Each pipe read until it has nothing now (at most twice its size: a
        leftover writing still is killed with the sandbox), then forgotten."""
        for fd, sink in list(self._streams.items()):
            moved = 0
            while moved < 2 * PIPE_SIZE and select.select([fd], [], [], 0)[0]:
                read = sink(fd)
                if not read:
                    break
                moved += read
            self.forget(fd)

    def _say(self, text: str) -> None:
        if self.log is not None:
            self.log(text)

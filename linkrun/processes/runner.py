"""One synchronous call: request → child → captured output → outcome.

The thread that spawns the child is the one that waits for it (bubblewrap's
--die-with-parent is bound to the spawning thread). The child runs in a
process group of its own; at its timeout, or when the call is cancelled, the
group gets SIGKILL. Once a sandbox's outer process exits, its init is killed,
and with it everything the program left: the child is reaped at once. Without
a sandbox (a pass-through in tests), what the program left in its group is
killed a second later; the answer waits for that second only when a leftover
still holds the output pipes.
"""

from __future__ import annotations

import functools
import mmap
import os
import select
import subprocess
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import IO

from .. import logger
from ..sandboxing import beneath
from .capture import Capture, CaptureReader
from .child import boottime, kill_group
from .keeper import Keeper
from ..errors import Refused
from .group import CHUNK, Leader, Watch, grow_pipe
from .spare import NotNow, Spare
from ..sandboxing.launch import Launch

TYPE_CHECKING = False
if TYPE_CHECKING:  # loaded only by a launch with limits
    from ..sandboxing.cgroups import Group
    from ..sandboxing.keptgroups import KeptGroups

LEFTOVER_GRACE = 1.0
PROGRESS_EVERY = 0.25
# A call's progress goes out at least this often, output or none: opencode
# (the TypeScript SDK's 60 s timer, reset by progress) cancels a call after a
# minute without one. Well under 15 s, for a loaded machine's late ticks.
PROGRESS_PACE = 5.0
KEEP_TOUCHED = 1 << 16  # bytes of output past which a call gives its buffer's pages back

_buffers = threading.local()


def _read_buffer() -> memoryview:
    """This thread's buffer for its calls' output, kept from call to call:
    mapped, so the kernel zeroes a page only as a read first fills it (an
    `echo hi` touches one), where a bytearray is zeroed whole (CHUNK bytes)."""
    if not hasattr(_buffers, "mapped"):
        _buffers.mapped = mmap.mmap(-1, CHUNK)
    return memoryview(_buffers.mapped)


@dataclass(frozen=True)
class Request:
    """A checked call: everything is resolved before anything runs."""

    program: str  # absolute host path
    args: tuple[str, ...]
    input: bytes | None
    folder: str  # relative to the files folder; "" is the files folder
    timeout: float


@dataclass
class Outcome:
    exit: int | None
    signal: int | None
    timed_out: bool
    seconds: float
    output: Capture
    errors: Capture
    cancelled: bool = False
    pid: int = 0  # the sandbox's, for telling this call's proxy refusals from another's
    limit: str | None = None  # "memory", "tasks", "cpu" or "file" when that limit bit (a cgroup's, an rlimit's), else None
    # Set by serve's owner of calls (calls/caller.py), for the answer's notes:
    git_notes: list[str] = field(default_factory=list)  # what the git check set aside (gitcheck.py)
    no_internet: str | None = None  # why the call had no internet, when it had none

    @property
    def failed(self) -> bool:
        """It ended with an exit other than 0, or by a signal."""
        return self.exit != 0 or self.signal is not None
    refused: str | None = None  # the note on the hosts the proxy refused this call, if any

    def __repr__(self) -> str:
        how = f"exit {self.exit}" if self.signal is None else f"signal {self.signal}"
        return f"<Outcome {how} {self.seconds:.3f}s out={self.output.total} err={self.errors.total}{' timed out' if self.timed_out else ''}>"


class Later:
    """What a call leaves to do once its answer is out: its spare's launch
    closed, its cgroup handed back, the spares made up again. Whoever sends
    the answer runs it then (`run`), so the answer waits for none of it."""

    def __init__(self) -> None:
        self._jobs: list[Callable[[], None]] = []

    def add(self, job: Callable[[], None]) -> None:
        self._jobs.append(job)

    def run(self) -> None:
        """Each job added so far, once; one that fails is said, and the rest run."""
        jobs, self._jobs = self._jobs, []
        for job in jobs:
            try:
                job()
            except Exception as problem:  # a bug of ours: the answer is out, the other jobs still run
                logger.error(f"after a call's answer: {problem!r}")


@dataclass
class Cancel:
    """Set by the server when the client cancels; the runner registers its kill."""

    cancelled: bool = False
    _hook: Callable[[], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            hook = self._hook
        if hook:
            hook()

    def on_cancel(self, hook: Callable[[], None]) -> None:
        with self._lock:
            self._hook = hook
            cancelled = self.cancelled
        if cancelled:
            hook()


def open_folder(files_fd: int, folder: str) -> int:
    """Open `folder` below the files folder one component at a time, following no link."""
    try:
        return beneath.open_folder(files_fd, folder)
    except beneath.NotBeneath as problem:
        if problem.why == "is a link":
            raise Refused(f"{problem}, and a call never enters a folder through a link",
                          "give the folder's own path") from None
        raise Refused(str(problem), "give a folder of the files folder, such as work or work/project") from None


class Runner:
    """Serve's calls run and watched. It holds what outlives a call: the
    groups whose leader exited, killed a second later (`close` kills them at
    once), and hands each call's cgroup to serve's kept groups
    (keptgroups.py) to keep or remove off the answer's path."""

    def __init__(self, groups: KeptGroups | None = None) -> None:
        self.groups = groups
        # Leftover groups by id, each with when it is killed: one thread kills
        # them in turn (a thread started for each call cost its answer a hand-off).
        self._leftovers: dict[int, tuple[float, subprocess.Popen[bytes]]] = {}
        self._lock = threading.Condition()
        self._killer: threading.Thread | None = None

    def close(self) -> None:
        """At serve's end: the leftovers killed now, not a second later."""
        with self._lock:
            pending = list(self._leftovers.items())
            self._leftovers.clear()
            self._lock.notify_all()
            killer = self._killer
        for _, (_, process) in pending:
            _reap(process)
        if killer is not None:
            killer.join()

    def _group_ended(self, group: Group) -> None:
        if self.groups is not None:
            self.groups.ended(group)
        else:
            group.remove(wait=1.0)

    def run(self, request: Request, launch: Launch, cwd_fd: int, cancel: Cancel, output_limit: int, later: Later,
            progress: Callable[[float, int], None] | None = None, spare: Spare | None = None,
            keepers: tuple[Keeper, Keeper] | None = None) -> Outcome:
        """Run the launch (the sandbox and the program) in `cwd_fd`, and capture it;
        or, given a spare handed the call's script (spare.py), the program in the spare.
        With `keepers` (output's, errors'), each stream is also kept whole
        (keeper.py); the caller finishes them once this returns. The call's
        cgroup is handed back `later`, its limit read first.

        `progress(seconds_so_far, bytes_so_far)` is called at most every
        PROGRESS_EVERY seconds while output grows, and every PROGRESS_PACE
        seconds while it does not; never after this returns.
        """
        started = boottime()
        if spare is not None:
            leader, group = spare.leader, spare.group
        else:
            leader, group = self._spawn(launch, f"/proc/self/fd/{cwd_fd}", subprocess.PIPE if request.input else subprocess.DEVNULL)
        try:
            outcome = self._watch(request, leader, leader.process, started, cancel, output_limit, later, progress,
                                  launch, keepers)
            outcome.limit = group.limit_hit() if group is not None else None
            # A call its timeout or a cancel ended did not end by a limit, whatever its errors say.
            if outcome.limit is None and outcome.failed and not outcome.timed_out and not outcome.cancelled:
                # The limits no cgroup holds here, and the largest file, rlimits all: signs in the end and errors.
                from ..sandboxing.fallback import bitten

                errors = bytes(outcome.errors.head + outcome.errors.tail)
                if not errors:  # `2>&1`: what it said of a refusal is in its output
                    errors = bytes(outcome.output.head + outcome.output.tail)
                outcome.limit = bitten(launch.holding, outcome.exit, outcome.signal, errors)
            return outcome
        finally:
            if group is not None:
                later.add(functools.partial(self._group_ended, group))

    def _spawn(self, launch: Launch, cwd: str, stdin: int) -> tuple[Leader, Group | None]:
        """The launch spawned, its group taken, its init held (`Launch.started`)."""
        with launch.spawning():
            process = subprocess.Popen(
                launch.command(),
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                process_group=0,
                pass_fds=tuple(launch.fds),
                env=launch.env,
            )
        leader = Leader(process)
        group = leader.cgroup = launch.take_group()
        try:
            leader.sandbox_init = launch.started()
        except BaseException:
            leader.abandon()
            if group is not None:
                self._group_ended(group)
            raise
        return leader, group

    def start_spare(self, launch: Launch, key: Hashable, files: str) -> Spare:
        """A sandbox whose loader waits for its program (spare.py), spawned by the
        spares' thread; NotNow, ended, when the proxy did not listen in it (a
        call's own sandbox may have the internet)."""
        leader, group = self._spawn(launch, files, subprocess.PIPE)
        spare = Spare(key, launch, leader, group)
        if launch.no_internet is not None:
            self.end_spare(spare)
            raise NotNow(launch.no_internet)
        return spare

    def end_spare(self, spare: Spare) -> None:
        """A spare not taken: killed with all it holds, reaped, its group kept or removed."""
        spare.leader.abandon()
        spare.close()
        if spare.group is not None:
            self._group_ended(spare.group)

    def _watch(self, request: Request, leader: Leader, process: subprocess.Popen[bytes], started: float, cancel: Cancel,
               output_limit: int, later: Later, progress: Callable[[float, int], None] | None, launch: Launch,
               keepers: tuple[Keeper, Keeper] | None = None) -> Outcome:
        cancel.on_cancel(leader.kill)  # a call's stop is SIGKILL at once, from the cancelling thread
        sandboxed = leader.sandbox_init is not None  # killed when the leader exits, and all the sandbox with it
        watch = Watch(leader, started + request.timeout, leftover_grace=LEFTOVER_GRACE)
        output, errors = Capture(output_limit), Capture(output_limit)
        buffer = _read_buffer()
        kept = keepers or (None, None)
        readers = (CaptureReader(output, buffer, kept[0]), CaptureReader(errors, buffer, kept[1]))
        try:
            assert process.stdout is not None and process.stderr is not None  # run made both pipes
            watch.drain(process.stdout.fileno(), readers[0])
            watch.drain(process.stderr.fileno(), readers[1])
            if request.input and process.stdin is not None:  # a pipe exactly when there is input
                _Input(watch, process.stdin, request.input)
            watch.run(_ticks(_Progress(progress, output, errors, started) if progress is not None else None, launch))
        except BaseException:
            leader.kill()  # done already if the watch itself failed
            process.wait()
            for keeper in keepers or ():
                keeper.finish(False)  # a call that failed keeps nothing
            raise
        finally:
            leader.close()
            for reader in readers:
                reader.close()
            if output.total + errors.total > KEEP_TOUCHED:  # a big output's pages given back: serve stays small
                _buffers.mapped.madvise(mmap.MADV_DONTNEED)
            for pipe in (process.stdin, process.stdout, process.stderr):
                if pipe is not None:
                    pipe.close()
        seconds = boottime() - started
        if sandboxed:  # all of it ended with its init: the leader's own group is left, after the answer
            later.add(functools.partial(_reap, process))
        elif leader.killed:
            _reap(process)
        else:
            self._kill_later(process.pid, process)
        return Outcome(watch.exit, watch.signal, watch.ending == "timed out", round(seconds, 3), output, errors,
                       cancel.cancelled, process.pid)

    def _kill_later(self, pgid: int, process: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._leftovers[pgid] = (time.monotonic() + LEFTOVER_GRACE, process)
            if self._killer is None:
                self._killer = threading.Thread(target=self._kill_due, daemon=True, name="leftovers")
                self._killer.start()

    def _kill_due(self) -> None:
        """Each leftover group killed at its time, then reaped (its id stayed
        ours until then); the thread ends when none is left."""
        while True:
            with self._lock:
                now = time.monotonic()
                due = [pgid for pgid, (at, _) in self._leftovers.items() if at <= now]
                if not due:
                    if not self._leftovers:
                        self._killer = None
                        return
                    self._lock.wait(min(at for at, _ in self._leftovers.values()) - now)
                    continue
                ended = [self._leftovers.pop(pgid)[1] for pgid in due]
            for process in ended:
                _reap(process)


def _reap(process: subprocess.Popen[bytes]) -> None:
    kill_group(process.pid)  # the unreaped leader keeps the group id ours
    process.wait()


class _Input:
    """Feeds the call's input to the program as its pipe takes it, then closes the pipe."""

    def __init__(self, watch: Watch, pipe: IO[bytes], data: bytes) -> None:
        self.watch, self.pipe, self.pending = watch, pipe, memoryview(data)
        self.fd = pipe.fileno()
        os.set_blocking(self.fd, False)
        grow_pipe(self.fd)
        watch.on_ready(self.fd, select.POLLOUT, self.feed)

    def feed(self) -> None:
        try:
            self.pending = self.pending[os.write(self.fd, self.pending[:CHUNK]):]
        except BlockingIOError:
            return
        except OSError:  # the program closed its input: the rest is not wanted
            self.pending = memoryview(b"")
        if not self.pending:
            self.watch.forget(self.fd)
            self.pipe.close()


def _ticks(progress: _Progress | None, launch: Launch) -> Callable[[Watch], float | None] | None:
    """The progress reports, and the git check while the program runs (gitcheck.Meanwhile)."""
    if launch.git is None:
        return progress
    from ..sandboxing.gitcheck import Meanwhile

    return Meanwhile(launch.git, launch.git_notes, progress)


class _Progress:
    """Reports the seconds and bytes so far: at most every PROGRESS_EVERY
    seconds when the bytes grew, and after PROGRESS_PACE seconds without a
    report when they did not."""

    def __init__(self, report: Callable[[float, int], None], output: Capture, errors: Capture,
                 started: float) -> None:
        self.report, self.output, self.errors, self.started = report, output, errors, started
        self.at = self.sent = boottime()
        self.reported = 0

    def __call__(self, watch: Watch) -> float:
        now = boottime()
        if now - self.at >= PROGRESS_EVERY:
            total = self.output.total + self.errors.total
            if total != self.reported or now - self.sent >= PROGRESS_PACE:
                # Cut, not rounded, to the hundredth: never more seconds than the answer's own.
                self.report(int((now - self.started) * 100) / 100, total)
                self.reported, self.sent = total, now
            self.at = now
        return self.at + PROGRESS_EVERY - now

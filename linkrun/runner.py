"""One synchronous call: request → child → captured output → outcome.

The thread that spawns the child is the one that waits for it (bubblewrap's
--die-with-parent is bound to the spawning thread). The child runs in a
process group of its own; at its timeout, or when the call is cancelled, the
group gets SIGKILL. Once the program exits, what it left in its group is
killed a second later; the answer waits for that second only when a leftover
still holds the output pipes.
"""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import threading
import time
from dataclasses import dataclass, field

from . import beneath
from .capture import Capture
from .child import SLICE, boottime, exit_status, kill_group
from .errors import Refused
from .launch import Launch, kill_init

CHUNK = 1 << 20
PIPE_SIZE = 1 << 20
LEFTOVER_GRACE = 1.0
PROGRESS_EVERY = 0.25
COALESCE = 0.0005  # seconds to let output gather between reads while it flows


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

    def __repr__(self) -> str:
        how = f"exit {self.exit}" if self.signal is None else f"signal {self.signal}"
        return f"<Outcome {how} {self.seconds:.3f}s out={self.output.total} err={self.errors.total}{' timed out' if self.timed_out else ''}>"


@dataclass
class Cancel:
    """Set by the server when the client cancels; the runner registers its kill."""

    cancelled: bool = False
    _hook: object = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def cancel(self):
        with self._lock:
            self.cancelled = True
            hook = self._hook
        if hook:
            hook()

    def on_cancel(self, hook):
        with self._lock:
            self._hook = hook
            cancelled = self.cancelled
        if cancelled:
            hook()


# Groups whose leader exited and that are killed a second later, so that
# shutdown can kill them at once instead.
_leftovers: dict[int, tuple[threading.Timer, subprocess.Popen]] = {}
_leftovers_lock = threading.Lock()


def kill_leftovers_now():
    with _leftovers_lock:
        pending = list(_leftovers.items())
        _leftovers.clear()
    for pgid, (timer, process) in pending:
        timer.cancel()
        kill_group(pgid)
        process.wait()


def open_folder(files_fd: int, folder: str) -> int:
    """Open `folder` below the files folder one component at a time, following no link."""
    try:
        return beneath.open_folder(files_fd, folder)
    except beneath.NotBeneath as problem:
        if problem.why == "is a link":
            raise Refused(f"{problem}, and a call never enters a folder through a link",
                          "give the folder's own path") from None
        raise Refused(str(problem), "give a folder of the files folder, such as work or work/project") from None


def run(request: Request, launch: Launch, cwd_fd: int, cancel: Cancel, output_limit: int,
        progress=None) -> Outcome:
    """Run the launch (the sandbox and the program) in `cwd_fd`, and capture it.

    `progress(bytes_so_far)` is called at most every PROGRESS_EVERY seconds
    while output grows, never after this returns.
    """
    started = boottime()
    deadline = started + request.timeout
    process = subprocess.Popen(
        launch.argv,
        stdin=subprocess.PIPE if request.input else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=f"/proc/self/fd/{cwd_fd}",
        process_group=0,
        pass_fds=tuple(launch.fds),
        env=launch.env,
    )
    pgid = process.pid
    pidfd = os.pidfd_open(process.pid)
    init = None

    def kill() -> None:
        kill_group(pgid)
        kill_init(init)

    cancel.on_cancel(kill)
    output, errors = Capture(output_limit), Capture(output_limit)
    try:
        init = launch.started()
        if cancel.cancelled:
            kill_init(init)
        state = _pump(process, pidfd, output, errors, request.input, deadline, cancel, progress, init)
    except BaseException:
        kill()
        process.wait()
        raise
    finally:
        os.close(pidfd)
        # The sandbox ends with its init, whatever a program did to the init's death signal.
        kill_init(init)
        if init is not None:
            os.close(init)
    exit_code, signal_number, group_killed, timed_out = state
    seconds = boottime() - started
    if group_killed:
        process.wait()
    else:
        _kill_later(pgid, process)
    return Outcome(exit_code, signal_number, timed_out, round(seconds, 3), output, errors, cancel.cancelled, process.pid)


def _kill_later(pgid: int, process: subprocess.Popen):
    def kill():
        with _leftovers_lock:
            if _leftovers.pop(pgid, None) is None:
                return
        kill_group(pgid)
        process.wait()  # reaped only now, so the group id stayed ours

    timer = threading.Timer(LEFTOVER_GRACE, kill)
    timer.daemon = True
    with _leftovers_lock:
        _leftovers[pgid] = (timer, process)
    timer.start()


class Skimmer:
    """Drains a stream whose head is already kept, copying only its tail.

    A flood spends its time copying pages out of the pipe. Once the head is
    full only the last bytes matter, so each chunk is tee'd (by reference) to
    a side pipe, the stream's own copy spliced to /dev/null, and of the side
    copy only the last tail-size bytes are read: a gigabyte passes in about
    the time `cat` takes to copy it, or less.
    """

    _tee = None

    def __init__(self):
        if Skimmer._tee is None:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            tee = libc.tee
            tee.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint)
            tee.restype = ctypes.c_ssize_t
            Skimmer._tee = (tee, ctypes.get_errno)
        self.side_r, self.side_w = os.pipe2(os.O_CLOEXEC)
        try:
            fcntl.fcntl(self.side_w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass
        self.null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)

    def skim(self, fd: int, capture: Capture) -> int:
        tee, get_errno = Skimmer._tee
        count = tee(fd, self.side_w, CHUNK, 0)
        if count < 0:
            raise OSError(get_errno(), "tee")
        if count == 0:
            return 0
        os.splice(fd, self.null, count)
        keep = min(count, capture.tail_size)
        if count > keep:
            os.splice(self.side_r, self.null, count - keep)
        last = b""
        while len(last) < keep:
            last += os.read(self.side_r, keep - len(last))
        capture.skip(count, last)
        return count

    def close(self):
        for fd in (self.side_r, self.side_w, self.null):
            os.close(fd)


def _pump(process, pidfd, output, errors, data, deadline, cancel, progress, init):
    """The call's loop: output, input, the child's exit, the deadline.

    Returns (exit, signal, group_killed, timed_out).
    """
    streams = {process.stdout.fileno(): output, process.stderr.fileno(): errors}
    for fd in streams:
        try:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass  # a smaller pipe only costs more wake-ups
    poller = select.poll()
    for fd in streams:
        poller.register(fd, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    stdin_fd = None
    pending = memoryview(b"")
    if data:
        stdin_fd = process.stdin.fileno()
        os.set_blocking(stdin_fd, False)
        try:
            fcntl.fcntl(stdin_fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass
        pending = memoryview(data)
        poller.register(stdin_fd, select.POLLOUT)

    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    skimmers: dict[int, Skimmer] = {}
    plain: set[int] = set()
    flowing = False
    exit_code = signal_number = None
    exited_at = None
    group_killed = timed_out = False
    last_progress = boottime()
    reported = 0
    while streams or exited_at is None:
        now = boottime()
        if exited_at is None and not group_killed and now >= deadline:
            kill_group(process.pid)
            kill_init(init)
            group_killed = timed_out = True
        if exited_at is not None and not group_killed and now - exited_at >= LEFTOVER_GRACE:
            kill_group(process.pid)  # a leftover still holds the pipes
            group_killed = True
        if cancel.cancelled:
            group_killed = True  # the cancel hook killed it
        if exited_at is not None and group_killed and streams and now - exited_at >= LEFTOVER_GRACE + SLICE:
            break  # something outside the group holds the pipes: stop reading
        wake = min(deadline - now, SLICE) if not group_killed else SLICE
        if exited_at is not None and not group_killed:
            wake = min(wake, exited_at + LEFTOVER_GRACE - now)
        if progress is not None:
            wake = min(wake, PROGRESS_EVERY)
        for fd, _event in poller.poll(max(0, wake) * 1000):
            if fd == pidfd:
                poller.unregister(pidfd)
                exit_code, signal_number = exit_status(pidfd)
                exited_at = boottime()
                kill_init(init)  # what the program left dies with the sandbox's pid namespace
            elif fd == stdin_fd:
                try:
                    written = os.write(stdin_fd, pending[:CHUNK])
                    pending = pending[written:]
                except BlockingIOError:
                    continue
                except OSError:  # the program closed its input: the rest is not wanted
                    pending = memoryview(b"")
                if not pending:
                    poller.unregister(stdin_fd)
                    process.stdin.close()
                    stdin_fd = None
            elif fd in streams:
                capture = streams[fd]
                if capture.head_full and fd not in plain:
                    try:
                        count = skimmers.setdefault(fd, Skimmer()).skim(fd, capture)
                    except OSError:
                        plain.add(fd)  # no tee here: copy as usual
                        continue
                else:
                    count = os.readv(fd, [view])
                    if count:
                        capture.feed(view[:count])
                if not count:
                    poller.unregister(fd)
                    del streams[fd]
                elif count < CHUNK:
                    flowing = True
        if flowing:
            # Let the pipe fill a little before the next wake: a flood written
            # 8 KiB at a time would otherwise wake us for every write.
            time.sleep(COALESCE)
            flowing = False
        if progress is not None and boottime() - last_progress >= PROGRESS_EVERY:
            total = output.total + errors.total
            if total != reported:
                progress(total)
                reported = total
            last_progress = boottime()
    for skimmer in skimmers.values():
        skimmer.close()
    if stdin_fd is not None:
        process.stdin.close()
    for fd in list(streams):
        del streams[fd]
    process.stdout.close()
    process.stderr.close()
    return exit_code, signal_number, group_killed, timed_out


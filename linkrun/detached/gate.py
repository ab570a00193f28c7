"""The gate: waits until the record names its group, then becomes the sandbox.

Run by the supervisor (step 3) as

    python -I -S gate.py <supervisor pid> <control fd> clear|keep <sandbox argv...>

in the command's folder, with the per-call part's descriptors already
inherited: stdlib only, no package and nothing else imported, so it starts
fast. It arms its death signal, checks that the supervisor is still its
parent, and waits for the byte `G` on the control pipe (step 4) before it
execs the sandbox, the same process. A supervisor killed before `G` leaves a
gate that exits (EOF, or the death signal): nothing runs that a sweep cannot
find. `clear` execs the sandbox with an empty environment (a real sandbox:
bwrap's own environment is readable inside at /proc/1/environ); `keep`
passes ours on (a pass-through sandbox in tests).

A supervisor that is still single-threaded at step 3 (every one but in a
rare case) forks its gate instead (`spawn`): the same steps, without the
interpreter's start that an exec of this script costs, on the way from
`start` to the program, and it joins the command's cgroup itself where the
booted gate's sandbox command starts with a shell that joins it. A
supervisor forked ahead forks its gate ahead too (`Ahead`), while both wait
for a start: the gate arms its death signal at once, and is later handed the
launch in one message, with its descriptors, which it takes to the numbers
the sandbox's argv names; a launch too large for one message gets a gate
forked for it, and the one ahead exits unused.
"""

import ctypes
import os
import signal
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:  # run as a script, the gate imports nothing of the package
    import socket
    from collections.abc import Sequence

    from typing import Protocol

    from linkrun.detached.input import InputPort
    from linkrun.processes.group import Leader
    from linkrun.sandboxing.launch import Launch
    from linkrun.state.records import Record

    class Waiting(Protocol):
        """A sandbox made ahead, its loader waiting for the program, as a gate holds it (spareahead.MadeAhead)."""

        @property
        def leader(self) -> Leader: ...  # its bwrap, its init held, its group

        @property
        def launch(self) -> Launch: ...  # its own: its init, its internet

        def hand_over(self, data: bytes) -> bool: ...  # the script; whether the loader took it

        def let_go(self) -> None: ...  # killed, reaped, what it holds let go (not its group)

        def close(self) -> None: ...  # once it ended: what it holds let go

PR_SET_PDEATHSIG = 1
HANDED_MOST = 1 << 20  # bytes of a launch handed to a gate forked ahead: more than a socket sends as one message


def main() -> int:
    supervisor, control, environment, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    return gate(supervisor, control, {} if environment == "clear" else os.environ, argv)


def gate(supervisor: int, control: int, env: "dict[str, str] | os._Environ[str]", argv: "list[str]") -> int:
    if not armed(supervisor):
        return 125
    # 4. Wait for the record to name our group.
    if os.read(control, 1) != b"G":
        return 0
    os.close(control)
    # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored
    # across exec: a `yes | head` would never end, and the file size limit
    # would not kill. subprocess restores them for serve's calls; we must here.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    try:
        os.execve(argv[0], argv, env)
    except OSError as problem:
        print(f"lnk-link-run: cannot start the sandbox {argv[0]}: {problem.strerror}", file=sys.stderr)
        return 127


class Gate:
    """What step 3 makes, as the supervisor holds it for the steps after it:
    a gate waiting for `G`, or a sandbox made ahead waiting for its script."""

    __slots__ = ("process", "leader", "launch", "control", "out_r", "ahead", "script")

    def __init__(self, process: "subprocess.Popen[bytes]", launch: "Launch", control: int, out_r: int,
                 ahead: "Waiting | None" = None, script: bytes = b"") -> None:
        from ..processes.group import Leader

        self.process = process
        if ahead is None:
            self.leader = Leader(process)  # the gate, watched; its sandbox_init may be set
            self.leader.cgroup = launch.take_group()
        else:
            self.leader = ahead.leader  # its init and its group held since it was made
        self.launch = launch  # the sandbox's argv and descriptors; its info pipe until the end
        self.control = control  # the gate's control pipe: `G` starts the program (-1 with a sandbox made ahead)
        self.out_r = out_r  # the program's output pipe
        self.ahead = ahead  # the sandbox made ahead, which `script` starts the program in
        self.script = script

    def let_run(self) -> str | None:
        """Step 5: `G`, or the script to the sandbox made ahead (its init held
        and its limits set since); the sandbox's init held by the leader. None
        once the program runs, else why nothing ran (and nothing will)."""
        from ..errors import LinkRunError

        if self.ahead is not None:
            return None if self.ahead.hand_over(self.script) else \
                "the sandbox made ahead ended before its loader took the program"
        os.write(self.control, b"G")
        os.close(self.control)
        self.control = -1
        try:
            self.leader.sandbox_init = self.launch.init_pidfd()
        except LinkRunError as problem:  # the program's limits could not be set: its init is killed
            self.leader.kill()
            return str(problem)
        return None

    @property
    def running(self) -> "Launch":
        """The launch whose sandbox runs the program (its init, its internet): the one made ahead, else ours."""
        return self.ahead.launch if self.ahead is not None else self.launch

    def let_go_of(self) -> None:
        """Before `G`: the gate reads end of file and exits, having run
        nothing (a sandbox made ahead is killed); waited for, and what step 3
        opened closed (its cgroup is the caller's)."""
        if self.control >= 0:
            os.close(self.control)
            self.control = -1
        if self.ahead is not None:
            self.ahead.let_go()
        else:
            self.process.wait()
            self.leader.close()
        self.close_launch()
        os.close(self.out_r)

    def close_launch(self) -> None:
        """Once its sandbox ended: the launch closed (its git check), and a sandbox made ahead's."""
        self.launch.close()
        if self.ahead is not None:
            self.ahead.close()


def make_gate(record: "Record", state: str, command_id: str, ahead: "Ahead | None" = None) -> "tuple[Gate, InputPort]":
    """Step 3, in the supervisor: the sandbox's launch prepared from the
    record, as serve prepares a call's (its cgroup made), and the gate spawned
    with its descriptors, the output pipe and the program's input (its port
    not yet listening): the gate itself only arms its death signal, waits for
    `G` and execs. Nothing of it is in the state or files folders. Raises
    OSError, or Refused for a link planted on its folders since start,
    having closed what it made. The gate forked `ahead` is handed the launch
    (closed here, whatever comes), else one is forked now. (A sandbox made
    ahead is taken instead: spareahead.py.)"""
    try:
        return _made(record, state, command_id, ahead)
    finally:
        if ahead is not None:
            ahead.close()  # unused: it exits


def _made(record: "Record", state: str, command_id: str, ahead: "Ahead | None") -> "tuple[Gate, InputPort]":
    from ..processes.group import grow_pipe
    from ..sandboxing import beneath
    from ..sandboxing.launch import Sandbox, prepare
    from .input import program_input

    box = Sandbox.of_record(record)
    files_fd = os.open(record["files"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        folder_fd = beneath.open_folder(files_fd, record["folder"])  # a link planted since start: refused
        try:
            launch = prepare(box, record["program_argv"], record["folder"], files_fd)
        except BaseException:
            os.close(folder_fd)
            raise
    finally:
        os.close(files_fd)
    control_r = control_w = out_r = out_w = stdin = -1
    port: InputPort | None = None
    try:
        control_r, control_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        grow_pipe(out_r)
        stdin, port = program_input(state, command_id, bool(record.get("tty")))
        process = _handed(ahead, launch, stdin, out_w, control_r, folder_fd)
    except BaseException:
        for fd in (control_w, out_r):
            if fd >= 0:
                os.close(fd)
        if port is not None:
            port.close()
        launch.close()  # and its cgroup, which nothing joined
        raise
    finally:
        for fd in (control_r, out_w, stdin, folder_fd):
            if fd >= 0:
                os.close(fd)  # the gate holds them now
        launch.handed_over()
    return Gate(process, launch, control_w, out_r), port


def armed(supervisor: int) -> bool:
    """3. Die with the supervisor's main thread, which forked us; then check it
    is still our parent, or it died before the death signal was armed."""
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0 and os.getppid() == supervisor


def _handed(ahead: "Ahead | None", launch: "Launch", stdin: int, out: int, control: int,
            folder: int) -> "subprocess.Popen[bytes]":
    """The gate ahead, given the launch; else (none, or gone) one spawned now, in the command's cgroup."""
    if ahead is not None and ahead.socket is not None and threading.active_count() == 1:
        try:
            return ahead.hand(launch, stdin, out, control, folder)
        except OSError:
            pass  # it died waiting
    return spawn(launch, stdin, out, control, folder)


class Forked(subprocess.Popen[bytes]):
    """A forked gate, as the supervisor waits for it: a Popen's pid, wait and
    returncode, and none of its spawning (nothing of Popen's own is used)."""

    def __init__(self, pid: int) -> None:  # not Popen's: the fork is made already
        self.pid, self.returncode, self.args = pid, None, ()
        self.stdin = self.stdout = self.stderr = None  # no pipes of Popen's (a sandbox made ahead sets its own)

    def poll(self) -> int | None:
        return self.returncode  # read by the watch's pidfd, never reaped before wait()

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def __del__(self) -> None:
        pass


def spawn(launch: "Launch", stdin: int, out: int, control: int, folder: int) -> "subprocess.Popen[bytes]":
    """The launch's gate, in a process group of its own, in `folder`, with
    stdin, the output pipe and the launch's descriptors (at their numbers), in
    the launch's cgroup and a session keyring of its own: a fork of this
    single-threaded supervisor, which enters them itself, else (a thread of
    its runs) this script, booted, spawned into them."""
    env, fds = launch.env, launch.fds
    if threading.active_count() > 1:  # a fork of a threaded process may inherit a lock held
        with launch.spawning():  # born in the command's cgroup, where it has one
            return subprocess.Popen(
                [sys.executable, "-I", "-S", __file__, str(os.getpid()), str(control),
                 "keep" if env is None else "clear", *launch.command()],
                stdin=stdin, stdout=out, stderr=out, pass_fds=(control, *fds), cwd=f"/proc/self/fd/{folder}",
                process_group=0, close_fds=True, env=env)
    supervisor = os.getpid()
    pid = os.fork()
    if pid == 0:
        _become(supervisor, "clear" if env is not None else "keep", launch.argv, launch.joins(), stdin, out, control,
                folder, {fd: fd for fd in fds})
    os.setpgid(pid, pid)  # as the child does: the group is ours to kill from now on
    return Forked(pid)


class Ahead:
    """A gate forked ahead, by a supervisor forked ahead while it waits for its
    start: a process group of its own, its death signal armed, nothing of
    ours held but its socket. `hand` gives it the launch it becomes, as
    `spawn`'s fork would have it; `close`, unused, lets it exit."""

    def __init__(self) -> None:
        import socket

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        supervisor = os.getpid()
        pid = os.fork()
        if pid == 0:
            _ahead(supervisor, theirs)
        theirs.close()
        os.setpgid(pid, pid)
        self.socket: socket.socket | None = ours
        self.process = Forked(pid)

    def hand(self, launch: "Launch", stdin: int, out: int, control: int, folder: int) -> "subprocess.Popen[bytes]":
        """The gate, given the launch and its descriptors, which it takes to
        their numbers: one message, which arrives whole or not at all. OSError
        when it was not sent (the gate is gone, or the argv is larger than a
        message can be): then nothing of it reached the gate."""
        import socket

        assert self.socket is not None
        fields = ["keep" if launch.env is None else "clear", *map(str, launch.fds), "", *launch.joins(), "",
                  *launch.argv]
        message = "\0".join(fields).encode("utf-8", "surrogateescape")
        socket.send_fds(self.socket, [message], [stdin, out, control, folder, *launch.fds])
        self.socket.close()
        self.socket = None
        return self.process

    def close(self) -> None:
        """Unused: it reads end of file and exits, reaped here."""
        if self.socket is not None:
            self.socket.close()
            self.socket = None
            self.process.wait()


def _ahead(supervisor: int, given: "socket.socket") -> NoReturn:
    """The gate forked ahead: it waits for its launch, then becomes it as `spawn`'s fork does."""
    code = 125
    try:
        os.setpgid(0, 0)  # as the supervisor does for us: the group is its to kill from now on
        keep = given.fileno()
        for low, high in ((2, keep), (keep, os.sysconf("SC_OPEN_MAX"))):
            os.closerange(low + 1, high)  # nothing of the supervisor's, ahead of the launch
        handed = _handed_launch(given) if armed(supervisor) else None
        if handed is None:
            code = 0
        else:
            fields, fds = handed
            mode, rest = fields[0], fields[1:]
            numbers = [int(n) for n in rest[:rest.index("")]]
            rest = rest[len(numbers) + 1:]
            joins, argv = rest[:rest.index("")], rest[rest.index("") + 1:]
            stdin, out, control, folder, *launch_fds = fds
            _become(supervisor, mode, argv, joins, stdin, out, control, folder,
                    dict(zip(numbers, launch_fds, strict=True)))
    finally:
        os._exit(code)


def _handed_launch(given: "socket.socket") -> "tuple[list[str], list[int]] | None":
    """What `Ahead.hand` sent, and the descriptors with it; None at end of file (never handed one)."""
    import socket

    message, fds, flags, _ = socket.recv_fds(given, HANDED_MOST, 64)
    given.close()
    if not message or flags & socket.MSG_TRUNC:
        return None
    return message.decode("utf-8", "surrogateescape").split("\0"), fds


def _become(supervisor: int, mode: str, argv: "list[str]", joins: "Sequence[str]", stdin: int, out: int,
            control: int, folder: int, fds: "dict[int, int]") -> NoReturn:
    """The forked gate: what Popen's child would do (`fds`: each number the
    sandbox's argv names, and where it is now), its keyring and cgroup
    entered, then the gate's steps."""
    import fcntl

    code = 125
    try:
        for caught in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(caught, signal.SIG_DFL)  # the supervisor's handlers are not ours
        signal.set_wakeup_fd(-1)
        os.setpgid(0, 0)
        os.fchdir(folder)
        if stdin == subprocess.DEVNULL:
            stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        if any(number != fd for number, fd in fds.items()):  # taken to their numbers, none over another
            above = max([control, *fds, *fds.values()]) + 1
            moved = {number: fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, above) for number, fd in fds.items()}
            control = fcntl.fcntl(control, fcntl.F_DUPFD_CLOEXEC, above)
            for number, fd in moved.items():
                os.dup2(fd, number)
            fds = {number: number for number in fds}
        kept = sorted({0, 1, 2, control, *fds})
        for low, high in zip(kept, [*kept[1:], os.sysconf("SC_OPEN_MAX")], strict=True):
            os.closerange(low + 1, high)  # nothing of the supervisor's but what the sandbox is handed
        for number in fds:
            os.set_inheritable(number, True)
        enter(joins)  # its keyring and cgroup, which a Popen's parent gives it
        code = gate(supervisor, control, {} if mode == "clear" else dict(os.environ), argv)
    finally:
        os._exit(code)


def enter(joins: "Sequence[str]") -> None:
    """A forked child's own `spawning()` and `command()`, before it becomes the sandbox: a new
    session keyring, and the launch's cgroup joined (`Launch.joins`). SystemExit(125), said on
    stderr, when either fails."""
    from ..errors import LinkRunError
    from ..sandboxing.launch import own_keyring

    try:
        own_keyring()
    except LinkRunError as problem:
        os.write(2, f"lnk-link-run: {problem}\n".encode())
        raise SystemExit(125) from None
    # "0": the writer itself (v1: this thread, the child's only one, without the global migration lock).
    for path in joins:
        try:
            with open(path, "w") as group:
                group.write("0")
        except OSError as error:
            os.write(2, f"lnk-link-run: cannot join the cgroup of its limits: {path}: {error.strerror}\n".encode())
            raise SystemExit(125) from None


if __name__ == "__main__":
    sys.exit(main())

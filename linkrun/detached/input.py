"""A background command's open input, held by its supervisor: what `write` sends reaches it here.

The supervisor holds the write end of the program's input pipe and listens
on a socket of its own in the state folder (`<id>.write`, 0600, in a folder
no sandbox sees). serve connects to it for each `write`: one packet asks,
one packet answers, so that nothing is written twice. The socket is gone
once the program has ended, and a connect is then refused: the command ended.

A request is a JSON line, then the bytes to write:
    {"op": "write", "eof": bool, "hold": bool}\\n<bytes>  →  {"taken": n} or {"error": why}
    {"op": "look"}\\n                                     →  {"waiting": bool}
With `hold`, a write taken keeps its connection: a second packet, {"output": true},
says that the program's output after the write is in its file (the connection
closes without it at the program's end): so serve reads its answer once, without
a file watch. serve hangs up when it waits no longer.
"""

from __future__ import annotations

import errno
import os
import select
import socket

import orjson
from collections.abc import Callable
from typing import Any

from ..errors import Refused
from ..kernel import process_stat
from ..state import layout
from ..state.records import State

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..processes.group import Watch
    from ..state.records import Shown

SUFFIX = layout.WRITE
MOST = 64 * 1024  # bytes one write may send: the packet's room, and a pipe's
HELD_MOST = 16  # connections held for the output after their write; more are let go at once
PENDING_MOST = 1024 * 1024  # bytes held for a program that does not read yet
# What /proc/<pid>/wchan says of a process blocked reading a pipe or a terminal.
READING = frozenset({"pipe_read", "anon_pipe_read", "pipe_wait", "pipe_wait_readable", "n_tty_read", "wait_woken"})
# And of one asleep in select(), which a prompt may wait in (Python's readline does).
SELECTING = ("do_select", "poll_schedule_timeout")
# select and pselect6's numbers, by machine type: /proc/<pid>/syscall names the one a process sleeps in.
SELECTS = {"x86_64": ("23", "270"), "aarch64": ("72",)}.get(os.uname().machine, ())
# And of one asleep in epoll_wait(), where an event loop waits (Node's REPL and prompts, Python's asyncio).
EPOLLING = ("do_epoll_wait", "ep_poll")
# epoll_wait, epoll_pwait and epoll_pwait2's numbers, by machine type.
EPOLL_WAITS = {"x86_64": ("232", "281", "441"), "aarch64": ("22", "441")}.get(os.uname().machine, ())
EPOLL_PWAIT2 = "441"  # the same on both
EPOLLIN = 0x1


def socket_path(state_fd: int, command_id: str) -> str:
    """The socket's path through the state folder's descriptor: short enough for any state folder."""
    return f"/proc/self/fd/{state_fd}/{command_id}{SUFFIX}"


class InputPort:
    """The program's input pipe, its write end ours, and the socket serve writes to it through."""

    def __init__(self, state: str, command_id: str, tty: bool = False, given: bool = False, pipe: int = -1) -> None:
        self.tty = tty  # its program reads a terminal the sandbox made, fed from our pipe
        self.given = given  # its input was given at start, as a file: we only say so
        # The pipe made here, or the write end of one whose read end the sandbox has (`pipe`: made ahead).
        self.read_end, self.write_end = (-1, -1) if given else (-1, pipe) if pipe >= 0 else os.pipe2(os.O_CLOEXEC)
        if not given:
            os.set_blocking(self.write_end, False)
        self.pipe = 0 if given else os.fstat(self.write_end).st_ino
        self.state, self.command_id = state, command_id
        self.path = layout.path(state, command_id, SUFFIX)
        self.pending = bytearray()
        self.closing = False  # eof asked: close once pending is written
        self.closed = given
        self.watch: Watch | None = None
        self.room_wanted = False  # the write end is polled for room
        self.gate_pid = 0
        self.held: list[socket.socket] = []  # writes waiting for the output after them
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listening = False  # bound at `listen`: until then nothing of ours is in the state folder

    def listen(self) -> None:
        """Bind `<id>.write` and listen: the supervisor's first act in the state folder for its input."""
        state_fd = os.open(self.state, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        old = os.umask(0o177)
        try:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.listener.bind(socket_path(state_fd, self.command_id))
            self.listening = True
        finally:
            os.umask(old)
            os.close(state_fd)
        self.listener.listen(8)
        self.listener.setblocking(False)

    def attach(self, watch: Watch, gate_pid: int) -> None:
        self.watch, self.gate_pid = watch, gate_pid
        watch.on_ready(self.listener.fileno(), select.POLLIN, self.accept)

    def accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return
        conn.settimeout(1.0)  # serve sends its one packet at once
        try:
            packet = conn.recv(MOST + 4096)
            head, _, data = packet.partition(b"\n")
            request = orjson.loads(head)
            reply = self.answer(request, data)
            conn.send(orjson.dumps(reply))
        except (OSError, ValueError):
            conn.close()  # a caller gone or garbled: nothing was done for it
            return
        if "taken" in reply and request.get("hold") and self.watch is not None and len(self.held) < HELD_MOST:
            self.held.append(conn)
            self.watch.on_ready(conn.fileno(), select.POLLIN, lambda: self._let_go(conn))
        else:
            conn.close()

    def following(self, pump: Callable[[int], int]) -> Callable[[int], int]:
        """The output's pump, telling the writes held that their answer is in the file as soon as it is:
        before the loop's pause after a trickle, and without a watch on serve's side."""
        def pumped(fd: int) -> int:
            moved = pump(fd)
            if moved and self.held:
                assert self.watch is not None  # a write is held only once attached
                self.watch.answered = True  # no pause after this trickle: serve asks its look at once
                for conn in list(self.held):
                    try:
                        conn.send(b'{"output":true}')
                    except OSError:
                        pass  # serve hung up: it reads for itself
                    self._let_go(conn)
            return moved
        return pumped

    def _let_go(self, conn: socket.socket) -> None:
        """A held write's connection, done: answered, or serve hung up."""
        if conn in self.held:
            self.held.remove(conn)
            if self.watch is not None:
                self.watch.forget(conn.fileno())
        conn.close()

    def answer(self, request: dict[str, Any], data: bytes) -> dict[str, Any]:
        if request.get("op") == "look":
            if self.watch is not None:
                self.watch.pump_now()  # what it printed before it went to wait is in the file first
            return {"waiting": self.waiting()}
        if self.given:
            return {"error": "it was given its input at start (input), then its end"}
        if self.closed or self.closing:
            return {"error": "its input is closed"}
        if len(self.pending) + len(data) > PENDING_MOST:
            return {"error": f"it has not read the {len(self.pending)} bytes written before: try again later"}
        self.pending += data
        self.closing = bool(request.get("eof"))
        self.flush()
        if self.closed and self.pending:
            return {"error": "it no longer reads its input (it closed it)"}
        return {"taken": len(data)}

    def flush(self) -> None:
        """As much as the pipe takes now; the rest when it has room."""
        try:
            while self.pending:
                self.pending = self.pending[os.write(self.write_end, self.pending):]
        except BlockingIOError:
            pass
        except OSError as problem:
            if problem.errno != errno.EPIPE:
                raise
            self.close_input()
            return
        if self.pending:
            self._on_room(self.flush)
        else:
            self._on_room(None)
            if self.closing:
                self.close_input()

    def _on_room(self, handler: Callable[[], None] | None) -> None:
        if self.watch is None or self.closed or self.room_wanted == (handler is not None):
            return
        self.room_wanted = handler is not None
        if handler is not None:
            self.watch.on_ready(self.write_end, select.POLLOUT, handler)
        else:
            self.watch.forget(self.write_end)

    def close_input(self) -> None:
        if not self.closed and self.write_end >= 0:
            self._on_room(None)
            self.closed = True
            os.close(self.write_end)

    def waiting(self) -> bool:
        """Whether a process of the command is blocked reading its input, with nothing left in it. On a
        terminal, also its relay asleep (util-linux's script, reading our pipe): it has passed on all the
        program printed before it went to wait, which the look then moves to the file (pump_now)."""
        if self.closed or self.pending or _unread(self.write_end) != 0:
            return False
        pipe = f"pipe:[{self.pipe}]"
        processes = descendants(self.gate_pid)
        if not any(_reads(pid, pipe, self.tty) for pid in processes):
            return False
        return not self.tty or all(_asleep(pid) for pid in processes if _stdin(pid) == pipe)

    def close(self) -> None:
        """At the program's end: no more writes; connects are refused from now on."""
        if self.watch is not None and self.listener.fileno() >= 0:
            self.watch.forget(self.listener.fileno())
        for conn in list(self.held):
            self._let_go(conn)  # it ended: serve reads what there is
        if self.listening:  # else the path is not ours
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        self.listener.close()
        self.close_input()
        if self.read_end >= 0:
            os.close(self.read_end)
            self.read_end = -1


def _unread(fd: int) -> int:
    """Bytes in the pipe not read yet (FIONREAD works on either end)."""
    import array
    import fcntl
    import termios

    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count)
    return count[0]


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, through /proc's children lists."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        found.append(parent)
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    todo.extend(int(child) for child in f.read().split())
            except OSError:
                pass
    return found


def _stdin(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/fd/0")
    except OSError:
        return ""


def _asleep(pid: int, task: str | None = None) -> bool:
    """Asleep, not woken to run: a process (or one of its threads) woken has no wait channel, and work to do."""
    try:
        fields = process_stat(pid, task)
    except OSError:
        return False  # hidden: not known to be asleep
    return fields is None or fields[0] == b"S"  # None: ended, it does no work


def _reads(pid: int, pipe: str, tty: bool) -> bool:
    """Whether the process is asleep in a read of its input: our pipe, or with `tty` its terminal (a pts of
    the sandbox's own devpts, which the terminal's relay feeds from our pipe as it comes)."""
    try:
        link = _stdin(pid)
        if link != pipe and not (tty and "pts/" in link):
            return False
        with open(f"/proc/{pid}/wchan") as f:
            where = f.read().strip()
        return where in READING or (where.startswith(SELECTING) and _selects_its_input_alone(pid)) \
            or (where.startswith(EPOLLING) and _epolls_for(pid, link))
    except (OSError, ValueError):
        return False


def _selects_its_input_alone(pid: int) -> bool:
    """Whether the process sleeps in a select() for reading on descriptor 0
    alone: its count of descriptors 1, a read set, no write or error set."""
    with open(f"/proc/{pid}/syscall") as f:
        number, *args = f.read().split()
    return number in SELECTS and len(args) >= 4 and int(args[0], 16) == 1 and int(args[1], 16) != 0 \
        and int(args[2], 16) == 0 and int(args[3], 16) == 0


def _epolls_for(pid: int, link: str) -> bool:
    """Whether the process sleeps in an epoll_wait() with no timeout (its
    loop has no timer pending: nothing to do but wait) whose set reads `link`
    (its input, by any descriptor: Node reads a terminal through one it
    opened again), and none of its threads is at work. An event loop always
    watches descriptors of its own beside (its wake-ups), so, unlike select(),
    the input need not be alone: a program waiting, with no timer, on its
    input and on something else at once is taken as waiting for its input."""
    with open(f"/proc/{pid}/syscall") as f:
        number, *args = f.read().split()
    if number not in EPOLL_WAITS or len(args) < 4:
        return False
    timeout = int(args[3], 16)
    # epoll_pwait2 takes a timespec's address (none: no timeout); the others, milliseconds (negative: none).
    untimed = timeout == 0 if number == EPOLL_PWAIT2 else bool(timeout & 0x80000000)
    if not untimed:
        return False
    with open(f"/proc/{pid}/fdinfo/{int(args[0], 16)}") as f:
        watched = [line.split() for line in f if line.startswith("tfd:")]
    # Each line: "tfd: <fd> events: <hex mask> data: …"
    if not any(int(fields[3], 16) & EPOLLIN and os.readlink(f"/proc/{pid}/fd/{fields[1]}") == link
               for fields in watched if len(fields) > 3):
        return False
    return all(_asleep(pid, task) for task in os.listdir(f"/proc/{pid}/task"))


def program_input(state: str, command_id: str, tty: bool = False) -> tuple[int, InputPort]:
    """The program's stdin: the input file given at start (read once, then EOF), else an open pipe of ours;
    and the port that answers writes either way (to say so, for the file), once it listens."""
    try:
        given = os.open(layout.path(state, command_id, layout.INPUT), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        port = InputPort(state, command_id, tty)
        fd, port.read_end = port.read_end, -1  # the caller's to close, once the gate has it
        return fd, port
    try:
        return given, InputPort(state, command_id, tty, given=True)
    except BaseException:
        os.close(given)
        raise


ASK_WAIT = 2.0  # seconds a supervisor has to answer: it answers from its loop, at once


def ask(state: str, command_id: str, request: dict[str, Any], data: bytes = b"",
        hold: float = 0.0) -> dict[str, Any] | None:
    """serve's side: one request to the command's supervisor, its answer; None when
    no supervisor listens (the program ended, or its supervisor is gone). With
    `hold` seconds, a write taken waits up to that long for the program's output
    after it to be in its file: then the answer has "output"."""
    state_fd = os.open(state, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as talk:
            talk.settimeout(ASK_WAIT)
            try:
                talk.connect(socket_path(state_fd, command_id))
                peer = talk.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                if int.from_bytes(peer[4:8], "little") != os.geteuid():
                    return None  # not our supervisor's: nothing is sent to it
                talk.send(orjson.dumps(request | ({"hold": True} if hold > 0 else {})) + b"\n" + data)
                reply = talk.recv(4096)
            except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError):
                return None
            answer: dict[str, Any] | None = orjson.loads(reply) if reply else None
            if answer is not None and hold > 0 and "taken" in answer:
                answer.update(_output_after(talk, hold))
    finally:
        os.close(state_fd)
    return answer


def _output_after(talk: socket.socket, hold: float) -> dict[str, Any]:
    """The held write's second packet, {"output": true}, within `hold` seconds; {} when none came."""
    talk.settimeout(hold)
    try:
        said = talk.recv(4096)
    except (TimeoutError, ConnectionResetError):
        return {}
    return orjson.loads(said) if said else {}


def waiting_for_input(state: str, record: Shown) -> bool:
    """Whether a running command is blocked reading its input, by its supervisor's look."""
    if record["state"] != State.RUNNING:
        return False
    try:
        reply = ask(state, record["id"], {"op": "look"})
    except (OSError, ValueError):
        return False
    return bool(reply and reply.get("waiting"))


# The terminal's size when the call gives none, and the most it may give.
COLUMNS, ROWS, MOST_SIDE = 80, 24, 1000
# The terminal's relay, run inside the sandbox: util-linux's script opens a
# pseudo-terminal of the sandbox's own devpts (never the host's), runs the
# program on it, copies our pipe to it and it to the output; -e: the
# program's exit status; -f: each output at once; -q: nothing of its own.
SCRIPT = "/usr/bin/script"


def terminal_size(arguments: dict[str, Any]) -> list[int] | None:
    """`start`'s tty, columns and rows: [columns, rows] when it runs on a terminal, else None."""
    tty = arguments.get("tty", False)
    if not isinstance(tty, bool):
        raise Refused("tty must be true or false")
    sides = {name: arguments.get(name, default) for name, default in (("columns", COLUMNS), ("rows", ROWS))}
    for name, side in sides.items():
        if isinstance(side, bool) or not isinstance(side, int) or not 1 <= side <= MOST_SIDE:
            raise Refused(f"{name} must be a whole number from 1 to {MOST_SIDE}")
        if not tty and name in arguments:
            raise Refused(f"{name} is the terminal's size: give it with tty")
    if not tty:
        return None
    if not os.access(SCRIPT, os.X_OK):
        raise Refused(f"tty needs {SCRIPT} (util-linux) on this host, which it lacks")
    return [sides["columns"], sides["rows"]]


def on_terminal(argv_tail: list[str], size: list[int]) -> list[str]:
    """The program's argv run on a terminal of its own, `size` [columns, rows] big."""
    import shlex

    columns, rows = size
    line = f"stty cols {columns} rows {rows} 2>/dev/null; export TERM=${{TERM:-xterm}}; exec {shlex.join(argv_tail)}"
    return [SCRIPT, "-qefc", line, "/dev/null"]

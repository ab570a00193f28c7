"""serve's warm fork server: supervisors forked ready-imported.

A supervisor booted fresh spends a hundred milliseconds starting Python and
importing itself before its program runs. So serve starts, once, a process
that has imported the supervisor (boot.py with `warm-fork`), and each
`start` asks it for one: it forks, the child makes a session of its own
and forks the supervisor, then exits, so the supervisor, like one started
by starter.py's shell, is in a session of its own and nobody's child that
waits; serve's threads never fork Python code.

Only its serve can ask: the request comes on a socketpair, whose other end
serve alone holds (close-on-exec, no path anyone could connect to, so no
sandbox can reach it); it carries the id and, by SCM_RIGHTS, the record's
lock and the log, which become the supervisor's stdin and stderr as they
would with the shell. The server ends when serve ends (end of file), and
serve kills and replaces one that died or stopped answering.

A supervisor waits for the server's go, which comes only after the answer
reached serve: a server that died before answering leaves nothing that
will run, so serve starts that command the old way. Each supervisor writes
`supervise <id>` over `warm-fork` and the dashes of the server's command
line (the same lengths), so `ps` finds it by the seeds' words.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from .. import logger

Supervise = Callable[[str, str, str], int]

WORD = "warm-fork"  # the server's word where a supervisor's is `supervise`: the same length
PLACEHOLDER = "-" * 16  # where a supervisor's id is: the same length
READY = b"R"  # the server's first message: imported, ready to fork
FORKED = "forked ready-imported by serve's warm fork server"  # the supervisor's log says so
GO = b"G"  # from the server to a supervisor: serve has its answer
ANSWER_WAIT = 2.0  # seconds: a server slower than this to answer is taken for dead
GIVE_UP = 3  # servers in a row that died before answering: then starts go the old way only
ASK = 64  # the longest request: an id


class WarmForks:
    """serve's side: its one fork server, started ahead and replaced when it
    died. `spawn` never waits on one that is booting or gone."""

    def __init__(self, state: str) -> None:
        self.state = state
        self.lock = threading.Lock()  # one request at a time on the socket
        self.process: subprocess.Popen[bytes] | None = None
        self.socket: socket.socket | None = None
        self.ready = False
        self.failures = 0  # servers in a row that died before answering

    def start(self) -> None:
        """Start the server unless one runs (after serve's first answer)."""
        with self.lock:
            if self.process is None:
                self._start()

    def spawn(self, command_id: str, lock_fd: int, log_fd: int) -> int | None:
        """The supervisor's intermediate's exit code (0: it runs), or None if
        no server was ready and nothing was started: the caller starts it the old way."""
        with self.lock:
            if self.process is None:
                self._start()  # for the next start: this one does not wait for its boot
                return None
            if not self.ready and not self._is_ready():
                return None
            assert self.socket is not None
            try:
                socket.send_fds(self.socket, [command_id.encode()], [lock_fd, log_fd])
            except OSError:
                self._replace()  # it never read the request
                return None
            answer = self._answer()
            if answer is None:
                logger.warning(f"the warm fork server did not answer within {ANSWER_WAIT:g} s; replacing it")
                self._end()  # killed and reaped: it lets nothing go any more
                answer = self._answer(late=True)  # unless its answer came at the last moment
                self._start()
            else:
                self.failures = 0
            return answer

    def _start(self) -> None:
        if self.socket is not None:  # the last server's, read to its end
            self.socket.close()
            self.socket = None
        if self.failures >= GIVE_UP:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(warm_argv(self.state), stdin=theirs.fileno(), stdout=subprocess.DEVNULL,
                                            close_fds=True, cwd="/")
        except OSError as problem:
            logger.warning(f"cannot start the warm fork server: {problem}; supervisors start the old way")
            ours.close()
            self.failures = GIVE_UP
            return
        finally:
            theirs.close()
        self.socket, self.ready = ours, False

    def _is_ready(self) -> bool:
        assert self.socket is not None
        try:
            first = self.socket.recv(1, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False  # still importing
        except OSError:
            first = b""
        if first != READY:
            self._replace()
            return False
        self.ready = True
        return True

    def _answer(self, late: bool = False) -> int | None:
        assert self.socket is not None
        try:
            if late:
                answer = self.socket.recv(4, socket.MSG_DONTWAIT)
            else:
                self.socket.settimeout(ANSWER_WAIT)
                answer = self.socket.recv(4)
        except OSError:  # a timeout among them
            return None
        finally:
            self.socket.settimeout(None)
        return int.from_bytes(answer, "big", signed=True) if len(answer) == 4 else None

    def _replace(self) -> None:
        self._end()
        self._start()

    def _end(self) -> None:
        """Kill and reap the server; the socket stays open for a late answer until the next `_start`."""
        assert self.process is not None
        self.failures += 1
        if self.failures == GIVE_UP:
            logger.warning(f"the warm fork server died {GIVE_UP} times; supervisors start the old way")
        self.process.kill()
        self.process.wait()
        self.process = None


def warm_argv(state: str) -> list[str]:
    """The server's command line: a supervisor's (starter.py) with WORD for
    `supervise` and PLACEHOLDER for the id, the same lengths, so that each
    supervisor it forks writes its own words in place (`name_self`)."""
    from .starter import BOOT, folders

    return [sys.executable, "-I", "-S", BOOT, folders(), WORD, PLACEHOLDER, "--state", state]


# -- the server -----------------------------------------------------------------


def serve_forks(state: str) -> int:
    """The server's loop, from boot.py: serve's socket is its stdin."""
    from ..state.records import ID
    from .supervise import supervise  # the point of it all: imported once, here

    warm_up()

    serve_end = socket.socket(fileno=0)
    serve_end.send(READY)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(serve_end, ASK, 2)
        except OSError:
            return 0
        if not message:
            return 0  # serve ended: so do we (supervisors live on)
        try:
            if len(fds) != 2 or not ID.fullmatch(message.decode(errors="replace")):
                code: int | None = 2
            else:
                code = fork_supervisor(serve_end, message.decode(), fds[0], fds[1], state, supervise)
        finally:
            for fd in fds:
                os.close(fd)
        if code is None:
            return 0  # serve is gone


def warm_up() -> None:
    """What a supervisor imports later, on its way to the program (records'
    orjson, a real sandbox's per-call part, /etc view, git check and
    cgroup, its init's pid) and beside it (the stop file's watch): imported
    here once, not in each supervisor."""
    import orjson  # noqa: F401
    from ..sandboxing import beneath, cgroups, etcview, fallback, gitcheck, initpid, percall  # noqa: F401
    from . import watch  # noqa: F401

    cgroups.place()  # where groups are made, read once here for every supervisor forked (the same cgroup as ours)


def fork_supervisor(serve_end: socket.socket, command_id: str, lock: int, log: int, state: str,
                    supervise: Supervise) -> int | None:
    """Fork one supervisor and answer serve; None if serve could not be answered."""
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        become_supervisor(serve_end, go_r, command_id, lock, log, state, supervise)
    os.close(go_r)
    try:
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        try:
            serve_end.send(code.to_bytes(4, "big", signed=True))
        except OSError:
            return None  # no go: the supervisor exits, and a sweep mends its record
        if code == 0:
            os.write(go_w, GO)
        return code
    finally:
        os.close(go_w)


def become_supervisor(serve_end: socket.socket, go_r: int, command_id: str, lock: int, log: int, state: str,
                      supervise: Supervise) -> NoReturn:
    """In the forked child: a session of its own, a second fork, then the
    supervisor once serve has its answer. Never returns."""
    code = 1
    try:
        os.setsid()
        if os.fork():
            os._exit(0)  # the intermediate: the server reaps it and answers
        serve_end.close()  # fd 0, which the lock takes: as starter.py's shell hands it over
        os.dup2(lock, 0)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # opened after: never on 0
        os.dup2(log, 2)
        os.closerange(3, go_r)
        os.closerange(go_r + 1, os.sysconf("SC_OPEN_MAX"))
        os.chdir("/")
        name_self(command_id)
        if os.read(go_r, 1) == GO:  # else serve never heard of us: nothing runs
            os.close(go_r)
            code = supervise(command_id, state, FORKED)
        else:
            code = 0
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def name_self(command_id: str) -> None:
    """`supervise <id>` over `warm-fork` and the dashes, in our own argv, so
    that /proc/<pid>/cmdline (and `ps`) show them as whole arguments."""
    import ctypes

    with open("/proc/self/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end, the 48th and 49th fields
    old = b"\0%s\0%s\0" % (WORD.encode(), PLACEHOLDER.encode())
    at = ctypes.string_at(start, end - start).find(old)
    if at >= 0 and len(command_id) == len(PLACEHOLDER):
        new = b"\0supervise\0%s\0" % command_id.encode()
        ctypes.memmove(start + at, new, len(new))
        sys.argv[2:4] = ["supervise", command_id]

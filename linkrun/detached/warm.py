"""serve's warm fork server: supervisors forked ready-imported, and ahead.

A supervisor booted fresh spends a hundred milliseconds starting Python and
importing itself before its program runs. So serve starts, once, a process
that has imported the supervisor (boot.py with `warm-fork`), which forks
a supervisor *ahead*, before any start asks for it: the child makes a
session of its own and forks again, then exits, so the supervisor, like
one started by starter.py's shell, is in a session of its own and nobody's
child that waits; serve's threads never fork Python code. It waits on a
socketpair of its own for a start, holding nothing else; at end of file
(the server ended, with serve) it exits.

Only its serve can ask: the request comes on a socketpair, whose other end
serve alone holds (close-on-exec, no path anyone could connect to, so no
sandbox can reach it); it carries the id and, by SCM_RIGHTS, the record's
lock and the log, which the server hands on to the supervisor ahead (one
forked then, when none waits), where they become its stdin and stderr as
they would with the shell. The next one is forked once the server had
AHEAD_AFTER of quiet, not beside the program just started.

serve's first message to the server is the fields every record of its
has for the sandbox (`null`: none); with them, a supervisor forked ahead
in a quiet moment also makes its command's sandbox ahead, whose loader
waits for the program (spareahead.py). One forked at a start makes it then.

The supervisor prepares what is its alone at once (its record read, its
sandbox's launch and cgroup, its input's pipe, its gate forked and
waiting), while the server answers serve; then it waits for the server's
go, sent only once serve has the answer, before it writes anything in the
state or files folders. A server that died before answering sends no go:
the supervisor lets its gate go without `G`, removes its cgroup, and
exits, having run and written nothing, so serve starts that command the
old way. Each supervisor writes `supervise <id>` over `warm-fork` and the
dashes of the server's command line (the same lengths), so `ps` finds it by
the seeds' words.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from .. import logger
from .gate import Ahead

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .spareahead import MadeAhead

Supervise = Callable[[str, str, str, Callable[[], bool], "Ahead | None", "MadeAhead | None"], int]

WORD = "warm-fork"  # the server's word where a supervisor's is `supervise`: the same length
PLACEHOLDER = "-" * 16  # where a supervisor's id is: the same length
READY = b"R"  # the server's first message: imported, ready to fork
FORKED = "forked ahead, ready-imported, by serve's warm fork server"  # the supervisor's log says so
GO = b"G"  # from the server to a supervisor: serve has its answer
ANSWER_WAIT = 2.0  # seconds: a server slower than this to answer is taken for dead
GIVE_UP = 3  # servers in a row that died before answering: then starts go the old way only
ASK = 64  # the longest request: an id
FIELDS_MOST = 1 << 20  # the longest fields serve sends: a sandbox's argv
AHEAD_AFTER = 0.02  # seconds of quiet after a start before the next supervisor is forked ahead


class WarmForks:
    """serve's side: its one fork server, started ahead and replaced when it
    died. `spawn` never waits on one that is booting or gone."""

    def __init__(self, state: str, fields: dict[str, object] | None = None) -> None:
        self.state = state
        self.fields = fields  # what a sandbox made ahead is made from: serve's (spareahead.py)
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
        try:
            import orjson

            ours.send(orjson.dumps(self.fields))  # the server's first read: `null` makes none ahead
        except OSError:
            pass  # it died already: its READY never comes, and it is replaced
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

    import orjson

    serve_end = socket.socket(fileno=0)
    try:
        fields = orjson.loads(serve_end.recv(FIELDS_MOST))  # serve's first message
        serve_end.send(READY)
    except (OSError, ValueError):
        return 0  # serve ended while we booted
    ahead: socket.socket | None = None  # our end of the supervisor forked ahead, waiting for a start
    quiet = True  # forking ahead is tried in the next quiet moment; after a failure, only at a start
    while True:
        if ahead is None and quiet and not select.select([serve_end], [], [], AHEAD_AFTER)[0]:
            ahead = fork_ahead(serve_end, state, supervise, fields)  # in a quiet moment, not beside a start's program
            quiet = ahead is not None
            continue
        try:
            message, fds, _, _ = socket.recv_fds(serve_end, ASK, 2)
        except OSError:
            return 0
        if not message:
            return 0  # serve ended: so do we, and the supervisor ahead (supervisors live on)
        try:
            if len(fds) != 2 or not ID.fullmatch(message.decode(errors="replace")):
                answered = answer(serve_end, 2)
            else:
                answered = hand_over(serve_end, ahead, message.decode(), fds, state, supervise)
                ahead, quiet = None, True
        finally:
            for fd in fds:
                os.close(fd)
        if not answered:
            return 0  # serve is gone


def warm_up() -> None:
    """What a supervisor imports later, on its way to the program (records'
    orjson, a real sandbox's per-call part, /etc view, git check and
    cgroup, its init's pid) and beside it (the stop file's watch): imported
    here once, not in each supervisor."""
    import math  # noqa: F401
    import orjson  # noqa: F401
    from .. import config  # noqa: F401
    from ..sandboxing import beneath, cgroups, etcview, fallback, gitcheck, initpid, launch, percall  # noqa: F401
    from . import spareahead, watch  # noqa: F401

    cgroups.place()  # where groups are made, read once here for every supervisor forked (the same cgroup as ours)


def fork_ahead(serve_end: socket.socket, state: str, supervise: Supervise,
               fields: dict[str, Any] | None) -> socket.socket | None:
    """A supervisor forked ahead: in a session of its own, nobody's child that
    waits, it waits for a start on its own socketpair; None when the forks failed."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        wait_ahead(serve_end, ours, theirs, state, supervise, fields)
    theirs.close()
    _, status = os.waitpid(pid, 0)  # the intermediate, which exits once it forked
    if os.waitstatus_to_exitcode(status) != 0:
        ours.close()
        return None
    return ours


def hand_over(serve_end: socket.socket, ahead: socket.socket | None, command_id: str, fds: list[int], state: str,
              supervise: Supervise) -> bool:
    """The start to the supervisor ahead (one forked now when none waits, or
    the one waiting died), serve answered, then the go: whether serve was
    answered. The supervisor ahead is used up (or closed) whatever comes."""
    for _ in range(2):
        ahead = ahead or fork_ahead(serve_end, state, supervise, None)  # its sandbox made at once: no time to gain
        if ahead is None:
            break
        try:
            socket.send_fds(ahead, [command_id.encode()], fds)
            break
        except OSError:  # it died waiting: another, once
            ahead.close()
            ahead = None
    if ahead is None:
        return answer(serve_end, 127)
    with ahead:
        if not answer(serve_end, 0):
            return False  # no go: it reads end of file, undoes what it made, and exits
        try:
            ahead.send(GO)
        except OSError:
            pass  # it died: a sweep finds its record's lock free
    return True


def answer(serve_end: socket.socket, code: int) -> bool:
    try:
        serve_end.send(code.to_bytes(4, "big", signed=True))
    except OSError:
        return False
    return True


def wait_ahead(serve_end: socket.socket, ours: socket.socket, theirs: socket.socket, state: str,
               supervise: Supervise, fields: dict[str, Any] | None) -> NoReturn:
    """In the forked child: a session of its own, a second fork; then the
    supervisor waits for its start, and once it has one, becomes its
    supervisor, which waits for the go before it touches the state or files
    folders. End of file instead (serve's server ended): it exits. Never returns."""
    code = 1
    try:
        os.setsid()
        if os.fork():
            os._exit(0)  # the intermediate: the server reaps it
        ours.close()
        serve_end.close()  # fd 0, which the lock takes
        os.dup2(os.open(os.devnull, os.O_RDWR), 1)  # opened on 0, which the lock takes later
        keep = theirs.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
        os.chdir("/")
        forked = Ahead()  # its gate, forked ahead too: a fork less on the way to the program
        gate: Ahead | None = forked
        made, how = None, FORKED  # its sandbox made ahead with serve's fields; its log's first line, after the go
        if fields is not None:
            from .spareahead import make as make_ahead

            try:
                made = make_ahead(fields, forked, state)
            except Exception as problem:  # noqa: BLE001 - its sandbox is made at its start
                how, gate = f"{FORKED}; its sandbox could not be made ahead ({problem!r}): made at its start", None
            if made is not None:
                gate = None  # it became the sandbox's bwrap
        message, fds, _, _ = socket.recv_fds(theirs, ASK, 2)
        if not message or len(fds) != 2:
            if gate is not None:
                gate.close()
            if made is not None:
                made.end()
            os._exit(0)  # the server ended before a start came
        command_id = message.decode()
        os.dup2(fds[0], 0)  # the lock, as starter.py's shell hands it over
        os.dup2(fds[1], 2)  # the log
        for fd in fds:
            os.close(fd)
        name_self(command_id)

        def go() -> bool:
            with theirs:
                try:
                    return theirs.recv(1) == GO  # else serve never heard of us: nothing runs
                except OSError:
                    return False

        code = supervise(command_id, state, how, go, gate, made)
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

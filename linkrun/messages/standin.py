"""A stand-in way in (`lnk-link-run way-in`): it checks each told message as a
harness must (§4) and prints what it was told. A tool for tests and for a
harness's authors; nothing of Link Run's own runs it.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import socket
import socketserver
import stat
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .. import logger
from ..address import AGENT_ID, parse_address
from ..config import split_flags
from ..errors import LinkRunError, UsageError
from .wayin import read_key, signature

# A way in refuses a Link-Date further than this from its clock (§4).
MAX_SKEW = 300
_BODY_MAX = 1 << 20
# Every field of §4's body, and the JSON types the stand-in accepts for each.
FIELDS = {
    "from": (str,), "thread": (str,), "hops": (int,), "text": (str,), "id": (str,),
    "state": (str,), "exit": (int, type(None)), "signal": (str, type(None)),
    "seconds": (int, float), "bytes": (int,),
}

LISTEN_HELP = """\
usage: lnk-link-run way-in --listen <address> --keyring <dir> [--status <code> [--retry-after <seconds>]] [--delay <seconds>]

A stand-in way in: it checks each told message as a harness must (the
signature with the key of the Link-Agent named, read from <keyring>/<agent>.key;
a Link-Date within 300 s of its clock; a JSON body with every field) and prints
each delivered message on stdout as one JSON line (the body plus "agent"). A
repeated "from" is answered 200 and not printed again. Refusals are logged on
stderr, one line each. SIGTERM or SIGINT: exit 0.

  --listen <address>      http://127.0.0.1:<port>/<path> (port 0: any free port; the
                          address is printed on stderr as "listening on <address>")
                          or unix:<absolute socket path>
  --keyring <dir>         the folder of the agents' keys (mode 0600 each)
  --status <code>         for tests: answer every request with this status, unchecked
  --retry-after <seconds> for tests: with --status, send this Retry-After header
  --delay <seconds>       for tests: wait this long before answering each request
"""
_VALUED = {"--listen", "--keyring", "--status", "--retry-after", "--delay"}
_SEE_HELP = "see lnk-link-run way-in --help"


# -- the flags ---------------------------------------------------------------

def _parse_listen(argv: list[str]) -> dict[str, Any]:
    if any(word in ("-h", "--help") for word in argv):
        return {"help": True}
    flags, rest = split_flags(argv, _VALUED, set(), set())
    if rest is not None:
        raise UsageError("the stand-in takes no words after --", _SEE_HELP)
    for name in ("--listen", "--keyring"):
        if name not in flags:
            raise UsageError(f"{name} is required", _SEE_HELP)
    keyring = os.path.abspath(str(flags["--keyring"]))
    if not os.path.isdir(keyring):
        raise UsageError(f"--keyring {keyring!r} is not a folder", "give the folder of the agents' keys")
    status = _status(flags.get("--status"))
    return {"help": False, "address": parse_address(str(flags["--listen"]), listening=True),
            "keyring": keyring, "status": status,
            "retry_after": _retry_after(flags.get("--retry-after"), status),
            "delay": _delay(flags.get("--delay"))}


def _status(text: str | None) -> int | None:
    if text is None:
        return None
    if not re.fullmatch(r"[1-5]\d\d", text) or int(text) < 200:
        raise UsageError(f"--status {text!r} is not an HTTP status", "give a code from 200 to 599")
    return int(text)


def _retry_after(text: str | None, status: int | None) -> str | None:
    if text is None:
        return None
    if not text.isdigit():
        raise UsageError(f"--retry-after {text!r} is not a whole number of seconds")
    if status is None:
        raise UsageError("--retry-after goes with --status")
    return text


def _delay(text: str | None) -> float:
    if text is None:
        return 0.0
    try:
        delay = float(text)
    except ValueError:
        delay = -1.0
    if not 0 <= delay < 86400:
        raise UsageError(f"--delay {text!r} is not a number of seconds")
    return delay


# -- serving -----------------------------------------------------------------

def main_listen(argv: list[str]) -> int:
    """`lnk-link-run way-in`: serve until SIGTERM or SIGINT, then exit 0."""
    options = _parse_listen(argv)
    if options["help"]:
        print(LISTEN_HELP, end="")
        return 0
    import signal

    server = _make_server(options)
    kind, where, path = options["address"]
    shown = f"unix:{where}" if kind == "unix" else f"http://127.0.0.1:{server.server_address[1]}{path}"
    # TERM and INT wait, blocked, for the main thread's sigwait: a handler would
    # run only when the main thread wakes, and the kernel may hand either to a
    # thread of the server's instead, which wakes nobody. The threads started
    # below inherit the block.
    ending = {signal.SIGTERM, signal.SIGINT}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, ending)
    serving = threading.Thread(target=server.serve_forever, name="way-in", daemon=True)
    try:
        serving.start()
        logger.info(f"listening on {shown}")
        signal.sigwait(ending)
    finally:
        server.stopping.set()
        server.shutdown()
        server.wait_handled(HANDLED_WAIT)  # their last lines written before the interpreter's end
        server.server_close()
        server.remove_socket()
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return 0


HANDLED_WAIT = 5.0  # seconds the end waits for the messages being handled


def _make_server(options: dict[str, Any]) -> TcpServer:
    kind, where, _ = options["address"]
    try:
        if kind == "unix":
            return UnixServer(options)
        return TcpServer(options)
    except OSError as error:
        raise UsageError(f"cannot listen on {options['address']!r}: {error.strerror or error}",
                         "choose another port or socket path") from None


class TcpServer(ThreadingHTTPServer):
    """The stand-in over TCP; it holds what its handlers share: the options,
    the `from`s already delivered, and the lock on the output lines."""

    daemon_threads = True

    def __init__(self, options: dict[str, Any]):
        self.options = options
        self.stopping = threading.Event()
        self.print_lock = threading.Lock()
        self.seen: set[tuple[str, str]] = set()
        self.seen_lock = threading.Lock()
        self.handling = 0  # requests whose threads have not ended
        self.handled = threading.Condition()
        super().__init__(self.bind_address(), WayInHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.handled:
            self.handling += 1
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.handled:
                self.handling -= 1
                self.handled.notify_all()

    def wait_handled(self, timeout: float) -> None:
        """Until every request taken has been answered, or `timeout` seconds."""
        with self.handled:
            self.handled.wait_for(lambda: self.handling == 0, timeout)

    def bind_address(self) -> Any:  # a (host, port) for TCP, a path for the Unix socket
        return ("127.0.0.1", self.options["address"][1])

    def server_bind(self) -> None:
        # HTTPServer's own would look the host's name up: not needed here.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]

    def remove_socket(self) -> None:
        pass

    def log(self, line: str) -> None:
        logger.info(line)

    def deliver(self, agent: str, message: dict[str, Any]) -> bool:
        """Prints a message the first time its `from` comes; False for a repeat."""
        with self.seen_lock:
            repeat = (agent, message["from"]) in self.seen
            self.seen.add((agent, message["from"]))
            if not repeat:
                with self.print_lock:
                    sys.stdout.write(json.dumps({**message, "agent": agent}) + "\n")
                    sys.stdout.flush()
        return not repeat


class UnixServer(TcpServer):
    address_family = socket.AF_UNIX

    def bind_address(self) -> Any:  # a (host, port) for TCP, a path for the Unix socket
        return self.options["address"][1]

    def server_bind(self) -> None:
        where = self.bind_address()
        _clear_stale_socket(where)
        # Only the user may connect: a socket's mode is what guards it.
        old = os.umask(0o077)
        try:
            socketserver.TCPServer.server_bind(self)
        finally:
            os.umask(old)
        self.inode = os.stat(where).st_ino
        self.server_name, self.server_port = "localhost", 0

    def remove_socket(self) -> None:
        where = self.bind_address()
        try:
            if os.stat(where).st_ino == self.inode:
                os.unlink(where)
        except OSError:
            pass


class _Refusal(Exception):
    def __init__(self, status: int, reason: str, agent: str = ""):
        super().__init__(reason)
        self.status, self.reason, self.agent = status, reason, agent


class WayInHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    timeout = 30  # a client that stops mid-request does not hold its thread forever
    server: TcpServer

    def log_message(self, *args: object) -> None:  # our own lines instead, one a refusal
        pass

    def answer(self, status: int, payload: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def refuse(self, refusal: _Refusal) -> None:
        agent = f" (agent {refusal.agent})" if refusal.agent else ""
        self.server.log(f"refused {refusal.status}: {refusal.reason}{agent}")
        self.answer(refusal.status, {"error": refusal.reason})

    def do_POST(self) -> None:
        options = self.server.options
        try:
            data = self._read_body()
            if options["delay"]:
                self.server.stopping.wait(options["delay"])
            if options["status"] is not None:
                return self._answer_status_only()
            agent, message = self._checked(data)
        except _Refusal as refusal:
            return self.refuse(refusal)
        delivered = self.server.deliver(agent, message)
        if not delivered:
            self.server.log(f"repeat of {message['from']} (agent {agent}): answered, not delivered again")
        self.answer(200, {"delivered": delivered})

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            raise _Refusal(411, "the request has no Content-Length")
        if int(length) > _BODY_MAX:
            raise _Refusal(413, f"the body is over {_BODY_MAX} bytes")
        return self.rfile.read(int(length))

    def _answer_status_only(self) -> None:
        status, retry_after = self.server.options["status"], self.server.options["retry_after"]
        self.server.log(f"answered {status} (--status)")
        self.answer(status, {"status": status}, {"Retry-After": retry_after} if retry_after else None)

    def _checked(self, data: bytes) -> tuple[str, dict[str, Any]]:
        """(agent, message) of a request that passes §4's checks; raises _Refusal."""
        path = self.server.options["address"][2]
        if self.path != path:
            raise _Refusal(404, f"nothing at {self.path!r}; this way in is at {path!r}")
        agent = self.headers.get("Link-Agent", "")
        if not AGENT_ID.fullmatch(agent):
            raise _Refusal(401, "no Link-Agent, or not of the form [A-Za-z0-9._-]+")
        self._check_signature(agent, data)
        if self.headers.get_content_type() != "application/json":
            raise _Refusal(415, "the Content-Type is not application/json", agent)
        try:
            message = json.loads(data)
        except ValueError as error:
            raise _Refusal(400, f"the body is not JSON ({error})", agent) from None
        problem = _check_message(message)
        if problem:
            raise _Refusal(400, problem, agent)
        return agent, message

    def _check_signature(self, agent: str, data: bytes) -> None:
        try:
            key = read_key(self.server.options["keyring"], agent)
        except LinkRunError as error:
            raise _Refusal(401, f"unknown agent: {error}", agent) from None
        date = self.headers.get("Link-Date", "")
        if not re.fullmatch(r"\d{1,12}", date):
            raise _Refusal(401, "the Link-Date is not unix seconds", agent)
        skew = int(date) - time.time()
        if abs(skew) > MAX_SKEW:
            raise _Refusal(401, f"the Link-Date is {abs(skew):.0f} s from this way in's clock"
                                f" (at most {MAX_SKEW})", agent)
        given = self.headers.get("Link-Signature", "")
        if not hmac.compare_digest(given.encode("ascii", "replace"),
                                   signature(key, agent, date, data).encode("ascii")):
            raise _Refusal(401, "the Link-Signature does not match the body", agent)


def _clear_stale_socket(path: str) -> None:
    """A socket left by a stand-in that was killed is removed; anything else is refused."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise UsageError(f"{path} exists and is not a socket", "choose another socket path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with probe:
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            os.unlink(path)
            return
        except OSError:
            return
    raise UsageError(f"something already listens on unix:{path}", "stop it, or choose another socket path")


def _check_message(message: object) -> str:
    """What is wrong with a told message's body, or ""."""
    if not isinstance(message, dict):
        return "the body is not a JSON object"
    for name, types in FIELDS.items():
        if name not in message:
            return f"the body lacks {name!r}"
        value = message[name]
        if isinstance(value, bool) or not isinstance(value, types):
            return f"the body's {name!r} is not of the right type"
    if not message["from"] or not message["thread"] or message["hops"] < 0:
        return "the body's 'from' or 'thread' is empty, or its 'hops' below 0"
    return ""

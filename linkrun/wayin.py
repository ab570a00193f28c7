"""The way in (§4): the told message, its signature and its one POST; and a
stand-in way in (`lnk-link-run way-in`) that checks and prints what it is told.

The supervisor and the sweep import this module only when they tell, and it
must stay small: stdlib only, and every module that only one path needs
(json, datetime, http.server, ...) is imported inside the function that needs
it. Of ours it imports `linkrun.errors` and, lazily, `linkrun.capture` and
`linkrun.config`.

The program's output goes into a message that the agent reads as a message
of its conversation, so it must never pass for the user's words: the text
frames it between markers that carry a nonce made after the program ended,
which nothing in the output can know (see `_nonce`).
"""

from __future__ import annotations

import os
import re
import socket
import stat
import time

from .errors import LinkRunError, UsageError

# Module constants so that a test may lower them (§4: connect 2 s, whole request 10 s).
CONNECT_TIMEOUT = 2.0
REQUEST_TIMEOUT = 10.0
# A way in refuses a Link-Date further than this from its clock (§4).
MAX_SKEW = 300

AGENT_ID = re.compile(r"[A-Za-z0-9._-]+")
_HTTP = re.compile(r"http://127\.0\.0\.1:(\d{1,5})(/[\x21-\x7e]*)?")
# sun_path holds 108 bytes with the final NUL.
_UNIX_PATH_MAX = 107
_KEY_MAX = 65536
_HEAD_MAX = 65536
_BODY_MAX = 1 << 20
# Every field of §4's body, and the JSON types the stand-in accepts for each.
FIELDS = {
    "from": (str,), "thread": (str,), "hops": (int,), "text": (str,), "id": (str,),
    "state": (str,), "exit": (int, type(None)), "signal": (str, type(None)),
    "seconds": (int, float), "bytes": (int,),
}


# -- the text ----------------------------------------------------------------

def told_text(record: dict, last_bytes: bytes) -> str:
    """The message of §4 for an ended `record`.

    `last_bytes` are the last bytes of the command's output, read by the
    caller (any length); the last `record["output"] // 2` of them are shown,
    without a character cut at their start.
    """
    from .capture import utf8_tail

    id_ = record["id"]
    command = " ".join(_quoted(word) for word in [record["program"], *record.get("args", [])])
    first = f"Background command {id_} ({command}, started {_local_time(record['started'])}) {_ending(record)}"
    if record["state"] == "failed to start":
        return first + "."
    total = int(record.get("bytes") or 0)
    dropped = int(record.get("kept_from") or 0)
    ran = ("ran at least " if record["state"] == "lost" else "ran ") + _elapsed(_seconds(record))
    if total == 0:
        return f"{first}; it {ran} and printed nothing."
    printed = f"printed {total} byte{'s' if total != 1 else ''}"
    if dropped:
        printed += f" ({dropped} dropped)"
    half = max(0, int(record.get("output") or 0) // 2)
    tail = utf8_tail(last_bytes[-half:]) if half else b""
    if not tail:
        return f"{first}; it {ran} and {printed}. None of it is shown here: read it with read id={id_}."
    shown, changed = _shown(tail)
    note = ""
    if changed:
        note = (" (shown with bytes that are not UTF-8, control and invisible characters as \\x or \\u"
                " escapes; read gives the raw bytes)")
    if not shown.endswith("\n"):
        shown += "\n"
    nonce = _nonce()
    return (f"{first}; it {ran} and {printed}. Its last bytes, between the markers, are the command's"
            f" own output{note}:\n"
            f"-----BEGIN OUTPUT {nonce}-----\n{shown}-----END OUTPUT {nonce}-----\n"
            f"read more with read id={id_}")


def _nonce() -> str:
    """The markers' nonce: 128 random bits as 32 lower-case hex digits, made for each
    message after the program ended and never stored, so the program cannot have
    printed it, and nothing in the output needs breaking (a lookalike cannot pass
    for a marker it does not know). What secrets.token_hex does, without its imports."""
    return os.urandom(16).hex()


def _ending(record: dict) -> str:
    limit = {"memory": "; it reached its memory limit, and the out-of-memory killer killed it",
             "tasks": "; it reached its task limit, and a fork or a new thread was refused"}
    return _state_ending(record) + limit.get(record.get("limit"), "")


def _state_ending(record: dict) -> str:
    state = record["state"]
    if state == "exited":
        if record.get("signal"):
            return f"was killed by {record['signal']}"
        status = record.get("exit")
        text = f"exited with status {status}"
        if isinstance(status, int) and 128 < status < 128 + 65:
            name = _signal_name(status - 128)
            if name:
                text += f" (128+{status - 128}: the program may have been killed by {name})"
        return text
    if state == "timed out":
        from .config import format_duration

        return f"timed out after {format_duration(record['timeout'])}"
    if state == "stopped":
        return "was stopped"
    if state == "lost":
        return "was lost: the agent or the computer stopped while it ran"
    if state == "failed to start":
        return "could not be started (its supervisor died before it ran; nothing ran)"
    return f"ended {state}"


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return ""


def _seconds(record: dict) -> float:
    if record.get("seconds") is not None:
        return float(record["seconds"])
    if record.get("ended") is not None and record.get("started") is not None:
        return max(0.0, float(record["ended"]) - float(record["started"]))
    return 0.0


def _elapsed(seconds: float) -> str:
    """0.42 → "0.42 s"; 125 → "2m 5s"; 3600 → "1h 0m 0s"."""
    if seconds < 60:
        return f"{seconds:.2f} s"
    whole = int(round(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days}d"] if days else []
    if days or hours:
        parts.append(f"{hours}h")
    return " ".join([*parts, f"{minutes}m", f"{secs}s"])


def _local_time(unix: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(float(unix)).astimezone().isoformat(timespec="seconds")


_PLAIN_WORD = re.compile(r"[\w@%+=:,./-]+", re.ASCII)


def _quoted(word: str) -> str:
    """A word as a shell would need it; control characters as bash's $'...' escapes,
    so an argument can never break the first line."""
    if _PLAIN_WORD.fullmatch(word):
        return word
    if not word.isprintable():
        escaped = "".join("\\" + c if c in "'\\" else c if c.isprintable() else _escape(c) for c in word)
        return f"$'{escaped}'"
    return "'" + word.replace("'", "'\\''") + "'"


# Characters that would make the output read otherwise than it is, to a
# person shown the conversation or to a harness splitting it into lines: C0
# and C1 controls but tab, newline and the CR of a CRLF (a lone CR or an
# escape sequence rewrites a terminal line), the Unicode line and paragraph
# separators, and the invisible format characters (zero-width, bidirectional
# overrides, the BOM). Shown as escapes.
_HIDDEN = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\xad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]|\r(?!\n)")


def _escape(c: str) -> str:
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _shown(data: bytes) -> tuple[str, bool]:
    """The output as it goes between the markers, and whether anything in it was changed
    (bytes that are not UTF-8 are shown as \\xNN, as hidden characters are)."""
    try:
        text, changed = data.decode("utf-8"), False
    except UnicodeDecodeError:
        text, changed = data.decode("utf-8", "backslashreplace"), True
    text, hidden = _HIDDEN.subn(lambda m: _escape(m.group()), text)
    return text, changed or bool(hidden)


# -- the body and the signature ----------------------------------------------

def body(record: dict, text: str) -> bytes:
    """The POST body of §4: compact JSON, UTF-8."""
    import json

    seconds = _seconds(record)
    return json.dumps({
        "from": f"run:{record['id']}",
        "thread": record["thread"],
        "hops": int(record.get("hops") or 0) + 1,
        "text": text,
        "id": record["id"],
        "state": record["state"],
        "exit": record.get("exit"),
        "signal": record.get("signal"),
        "seconds": round(seconds, 3),
        "bytes": int(record.get("bytes") or 0),
    }, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def signature(key: bytes, agent: str, date: str, body: bytes) -> str:
    """Lowercase hex HMAC-SHA256(key, agent + "\\n" + date + "\\n" + body)."""
    import hashlib
    import hmac

    message = agent.encode("ascii") + b"\n" + date.encode("ascii") + b"\n" + body
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def read_key(keyring: str, agent: str) -> bytes:
    """`<keyring>/<agent>.key`: its raw bytes, trailing ASCII white space stripped.

    Opened with O_NOFOLLOW (a link is refused, never followed) and O_NONBLOCK
    (a FIFO planted there cannot hang the reader); refused unless it is a
    regular file of this user that neither group nor others may read.
    Raises LinkRunError saying what to fix.
    """
    if not AGENT_ID.fullmatch(agent):
        raise LinkRunError(f"the agent id {agent!r} is not of the form [A-Za-z0-9._-]+",
                           "give the agent's id as Link names it")
    path = os.path.join(keyring, agent + ".key")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise LinkRunError(f"the agent's key {path} is missing",
                           "write the agent's key there, mode 0600, or give the right --keyring") from None
    except OSError as error:
        if os.path.islink(path):
            raise LinkRunError(f"the agent's key {path} is a symbolic link, which is never followed",
                               "put the key file itself there, mode 0600") from None
        raise LinkRunError(f"the agent's key {path} cannot be opened ({error.strerror})",
                           "make it a file of yours, mode 0600") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise LinkRunError(f"the agent's key {path} is not a regular file",
                               "put the key file itself there, mode 0600")
        if info.st_mode & 0o077:
            raise LinkRunError(
                f"the agent's key {path} may be read by others (mode {stat.S_IMODE(info.st_mode):04o})",
                f"run: chmod 600 {path}")
        if info.st_uid != os.geteuid():
            raise LinkRunError(f"the agent's key {path} belongs to another user (uid {info.st_uid})",
                               "the key must be a file of the user the agent runs as")
        data = b""
        while len(data) <= _KEY_MAX:
            chunk = os.read(fd, _KEY_MAX + 1 - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    if len(data) > _KEY_MAX:
        raise LinkRunError(f"the agent's key {path} is over {_KEY_MAX} bytes", "is this the right file?")
    key = data.rstrip(b" \t\n\r\v\f")
    if not key:
        raise LinkRunError(f"the agent's key {path} is empty", "write the agent's key there")
    return key


# -- the address -------------------------------------------------------------

def parse_address(text: str, listening: bool = False) -> tuple:
    """`http://127.0.0.1:<port>/<path>` → ("http", port, path);
    `unix:<absolute socket path>` → ("unix", path, "/").

    Port 0 is allowed only when `listening`. Raises UsageError otherwise.
    """
    hint = "write it as http://127.0.0.1:<port>/<path> or unix:<absolute socket path>"
    if text.startswith("unix:"):
        path = text[len("unix:"):]
        if not path.startswith("/") or "\0" in path:
            raise UsageError(f"the way in {text!r} is not an absolute socket path", hint)
        if len(os.fsencode(path)) > _UNIX_PATH_MAX:
            raise UsageError(f"the way in's socket path is over {_UNIX_PATH_MAX} bytes",
                             "choose a shorter path (the kernel limit of a socket's address)")
        return ("unix", path, "/")
    match = _HTTP.fullmatch(text)
    if not match or int(match.group(1)) > 65535 or (int(match.group(1)) == 0 and not listening):
        raise UsageError(f"the way in {text!r} is not a local address", hint)
    return ("http", int(match.group(1)), match.group(2) or "/")


# -- sending -----------------------------------------------------------------

class Delivery:
    """The outcome of `send`: "told", "not reached" (try again later, after
    `retry_after` seconds when the way in said so) or "given up" (final);
    `detail` is one line for the log."""

    __slots__ = ("outcome", "retry_after", "detail")

    def __init__(self, outcome: str, retry_after: float | None = None, detail: str = ""):
        self.outcome = outcome
        self.retry_after = retry_after
        self.detail = detail

    def __repr__(self) -> str:
        return f"Delivery(outcome={self.outcome!r}, retry_after={self.retry_after!r}, detail={self.detail!r})"


class _Unreached(Exception):
    """The request did not get an answer: refused, timed out, cut off."""


def send(way_in: str, agent: str, keyring: str, body: bytes, now=time.time) -> Delivery:
    """One message to the way in, as §4 says; a 401 is tried once more with a
    fresh Link-Date (and the key read again: it may just have been replaced).

    Never raises for a delivery problem: the outcome says what to do. A
    request that timed out may still have been delivered; sending it again is
    safe because the way in drops a repeated `from`.
    """
    try:
        address = parse_address(way_in)
    except LinkRunError as error:
        return Delivery("given up", None, str(error))
    if not AGENT_ID.fullmatch(agent):
        return Delivery("given up", None, f"the agent id {agent!r} is not of the form [A-Za-z0-9._-]+")
    if not os.path.isabs(keyring):
        # A detached supervisor's working folder is no one's choice: a relative keyring is a bug.
        return Delivery("given up", None, f"the keyring {keyring!r} is not an absolute path; give the record an absolute keyring")
    for attempt in (1, 2):
        try:
            key = read_key(keyring, agent)
        except LinkRunError as error:
            return Delivery("given up", None, str(error))
        date = str(int(now()))
        try:
            status, reason, retry_after, said = _post(address, agent, date, signature(key, agent, date, body), body)
        except _Unreached as error:
            return Delivery("not reached", None, f"{error} ({way_in})")
        detail = f"{status} {reason}".strip() + (f": {said}" if said else "") + f" ({way_in})"
        if 200 <= status < 300:
            return Delivery("told", None, detail)
        if status in (408, 429) or 500 <= status < 600:
            return Delivery("not reached", retry_after if status in (429, 503) else None, detail)
        if status == 401 and attempt == 1:
            continue
        if status == 401:
            detail = "refused twice, " + detail + "; check that the way in holds this agent's key and that the clocks agree"
        return Delivery("given up", None, detail)
    raise AssertionError("unreachable")


def _post(address: tuple, agent: str, date: str, sign: str, body: bytes):
    """One POST with a deadline over the whole request → (status, reason,
    retry_after, first line of an error answer). Raises _Unreached.

    HTTP is written by hand rather than with http.client: the request is one
    fixed shape, the answer's head is all we need, and http.client would pull
    the email package into a supervisor."""
    kind, where, path = address
    host = "localhost" if kind == "unix" else f"127.0.0.1:{where}"
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nLink-Agent: {agent}\r\nLink-Date: {date}\r\n"
            f"Link-Signature: {sign}\r\nConnection: close\r\n\r\n").encode("ascii")
    deadline = time.monotonic() + REQUEST_TIMEOUT

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Unreached(f"no answer within {REQUEST_TIMEOUT:g} s")
        return remaining

    family = socket.AF_UNIX if kind == "unix" else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as error:
        raise _Unreached(f"no socket: {error.strerror}") from None
    with sock:
        try:
            sock.settimeout(min(CONNECT_TIMEOUT, left()))
            sock.connect(where if kind == "unix" else ("127.0.0.1", where))
        except TimeoutError:
            raise _Unreached(f"could not connect within {min(CONNECT_TIMEOUT, REQUEST_TIMEOUT):g} s") from None
        except OSError as error:
            raise _Unreached(f"could not connect: {error.strerror or error}") from None
        try:
            sock.settimeout(left())
            sock.sendall(head + body)
            status, reason, headers, rest = _read_head(sock, left)
            said = ""
            if not 200 <= status < 300:
                said = _read_some(sock, left, rest, headers)
        except TimeoutError:
            raise _Unreached(f"no answer within {REQUEST_TIMEOUT:g} s") from None
        except OSError as error:
            raise _Unreached(f"the connection failed: {error.strerror or error}") from None
    return status, reason, _retry_after(headers.get("retry-after")), said


def _read_head(sock, left):
    buffer = b""
    while True:
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(buffer) > _HEAD_MAX:
                raise _Unreached("the way in answered a head over 64 KiB")
            sock.settimeout(left())
            chunk = sock.recv(65536)
            if not chunk:
                raise _Unreached("the way in closed the connection without an answer")
            buffer += chunk
            continue
        lines = buffer[:end].decode("latin-1").split("\r\n")
        rest = buffer[end + 4:]
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise _Unreached(f"the way in answered something that is not HTTP: {lines[0][:80]!r}")
        status = int(parts[1])
        if 100 <= status < 200:  # an interim answer: the real one follows
            buffer = rest
            continue
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, (parts[2] if len(parts) > 2 else "").strip(), headers, rest


def _read_some(sock, left, rest: bytes, headers: dict) -> str:
    """The first line of an error answer's body, for the log; best effort."""
    # At most a second of the request's time: this is only for the log.
    until = time.monotonic() + min(1.0, left())
    try:
        want = min(int(headers.get("content-length", "300")), 300)
        while len(rest) < want and time.monotonic() < until:
            sock.settimeout(max(0.01, until - time.monotonic()))
            chunk = sock.recv(want - len(rest))
            if not chunk:
                break
            rest += chunk
    except (OSError, ValueError, _Unreached):
        pass
    line = rest[:300].decode("utf-8", "replace").strip().split("\n", 1)[0]
    return "".join(c if c.isprintable() else "?" for c in line)


def _retry_after(value: str | None) -> float | None:
    """Retry-After as seconds: a number of seconds, or an HTTP date."""
    if not value:
        return None
    if value.isdigit():
        return int(value)
    from email.utils import parsedate_to_datetime

    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


# -- the stand-in way in -----------------------------------------------------

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


def _parse_listen(argv: list[str]) -> dict:
    flags = {"--listen": None, "--keyring": None, "--status": None, "--retry-after": None, "--delay": None}
    words = list(argv)
    while words:
        word = words.pop(0)
        if word in ("-h", "--help"):
            return {"help": True}
        name, equals, value = word.partition("=")
        if name not in flags:
            raise UsageError(f"unknown flag {word!r}", "see lnk-link-run way-in --help")
        if not equals:
            if not words:
                raise UsageError(f"{name} needs a value", "see lnk-link-run way-in --help")
            value = words.pop(0)
        flags[name] = value
    for name in ("--listen", "--keyring"):
        if flags[name] is None:
            raise UsageError(f"{name} is required", "see lnk-link-run way-in --help")
    options = {"help": False, "address": parse_address(flags["--listen"], listening=True),
               "keyring": os.path.abspath(flags["--keyring"]), "status": None, "retry_after": None, "delay": 0.0}
    if not os.path.isdir(options["keyring"]):
        raise UsageError(f"--keyring {options['keyring']!r} is not a folder", "give the folder of the agents' keys")
    if flags["--status"] is not None:
        if not re.fullmatch(r"[1-5]\d\d", flags["--status"]) or int(flags["--status"]) < 200:
            raise UsageError(f"--status {flags['--status']!r} is not an HTTP status", "give a code from 200 to 599")
        options["status"] = int(flags["--status"])
    if flags["--retry-after"] is not None:
        if not flags["--retry-after"].isdigit():
            raise UsageError(f"--retry-after {flags['--retry-after']!r} is not a whole number of seconds")
        if options["status"] is None:
            raise UsageError("--retry-after goes with --status")
        options["retry_after"] = flags["--retry-after"]
    if flags["--delay"] is not None:
        try:
            options["delay"] = float(flags["--delay"])
        except ValueError:
            options["delay"] = -1.0
        if not 0 <= options["delay"] < 86400:
            raise UsageError(f"--delay {flags['--delay']!r} is not a number of seconds")
    return options


def main_listen(argv: list[str]) -> int:
    """`lnk-link-run way-in`: serve until SIGTERM or SIGINT, then exit 0."""
    options = _parse_listen(argv)
    if options["help"]:
        print(LISTEN_HELP, end="")
        return 0
    import signal
    import sys
    import threading

    server = _make_server(options)
    kind, where, path = options["address"]
    shown = f"unix:{where}" if kind == "unix" else f"http://127.0.0.1:{server.server_address[1]}{path}"
    # The signal handlers only record; the main thread shuts the server down.
    stopping = server.stopping
    previous = {number: signal.signal(number, lambda *_: stopping.set())
                for number in (signal.SIGTERM, signal.SIGINT)}
    serving = threading.Thread(target=server.serve_forever, name="way-in", daemon=True)
    try:
        serving.start()
        print(f"listening on {shown}", file=sys.stderr, flush=True)
        stopping.wait()
    finally:
        stopping.set()
        server.shutdown()
        server.server_close()
        server.remove_socket()
        for number, handler in previous.items():
            signal.signal(number, handler)
    return 0


def _make_server(options: dict):
    import json
    import socketserver
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    kind, where, path = options["address"]
    keyring, status_only, delay = options["keyring"], options["status"], options["delay"]
    print_lock = threading.Lock()
    seen: set[tuple[str, str]] = set()
    seen_lock = threading.Lock()

    def log(line: str):
        with print_lock:
            print(line, file=sys.stderr, flush=True)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"
        timeout = 30  # a client that stops mid-request does not hold its thread forever

        def log_message(self, *args):  # our own lines instead, one a refusal
            pass

        def answer(self, status: int, payload: dict, extra: dict | None = None):
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def refuse(self, status: int, reason: str, agent: str = ""):
            log(f"refused {status}: {reason}" + (f" (agent {agent})" if agent else ""))
            self.answer(status, {"error": reason})

        def do_POST(self):
            length = self.headers.get("Content-Length", "")
            if not length.isdigit():
                return self.refuse(411, "the request has no Content-Length")
            if int(length) > _BODY_MAX:
                return self.refuse(413, f"the body is over {_BODY_MAX} bytes")
            data = self.rfile.read(int(length))
            if delay:
                server.stopping.wait(delay)
            if status_only is not None:
                log(f"answered {status_only} (--status)")
                extra = {"Retry-After": options["retry_after"]} if options["retry_after"] else None
                return self.answer(status_only, {"status": status_only}, extra)
            if self.path != path:
                return self.refuse(404, f"nothing at {self.path!r}; this way in is at {path!r}")
            agent = self.headers.get("Link-Agent", "")
            if not AGENT_ID.fullmatch(agent):
                return self.refuse(401, "no Link-Agent, or not of the form [A-Za-z0-9._-]+")
            try:
                key = read_key(keyring, agent)
            except LinkRunError as error:
                return self.refuse(401, f"unknown agent: {error}", agent)
            date = self.headers.get("Link-Date", "")
            if not re.fullmatch(r"\d{1,12}", date):
                return self.refuse(401, "the Link-Date is not unix seconds", agent)
            skew = int(date) - time.time()
            if abs(skew) > MAX_SKEW:
                return self.refuse(401, f"the Link-Date is {abs(skew):.0f} s from this way in's clock"
                                        f" (at most {MAX_SKEW})", agent)
            import hmac

            given = self.headers.get("Link-Signature", "")
            if not hmac.compare_digest(given.encode("ascii", "replace"),
                                       signature(key, agent, date, data).encode("ascii")):
                return self.refuse(401, "the Link-Signature does not match the body", agent)
            if self.headers.get_content_type() != "application/json":
                return self.refuse(415, "the Content-Type is not application/json", agent)
            try:
                message = json.loads(data)
            except ValueError as error:
                return self.refuse(400, f"the body is not JSON ({error})", agent)
            problem = _check_message(message)
            if problem:
                return self.refuse(400, problem, agent)
            with seen_lock:
                repeat = (agent, message["from"]) in seen
                seen.add((agent, message["from"]))
                if not repeat:
                    with print_lock:
                        sys.stdout.write(json.dumps({**message, "agent": agent}) + "\n")
                        sys.stdout.flush()
            if repeat:
                log(f"repeat of {message['from']} (agent {agent}): answered, not delivered again")
            self.answer(200, {"delivered": not repeat})

    class TcpServer(ThreadingHTTPServer):
        daemon_threads = True

        def server_bind(self):
            # HTTPServer's own would look the host's name up: not needed here.
            socketserver.TCPServer.server_bind(self)
            self.server_name, self.server_port = "127.0.0.1", self.server_address[1]

        def remove_socket(self):
            pass

    class UnixServer(TcpServer):
        address_family = socket.AF_UNIX

        def server_bind(self):
            _clear_stale_socket(where)
            # Only the user may connect: a socket's mode is what guards it.
            old = os.umask(0o077)
            try:
                socketserver.TCPServer.server_bind(self)
            finally:
                os.umask(old)
            self.inode = os.stat(where).st_ino
            self.server_name, self.server_port = "localhost", 0

        def remove_socket(self):
            try:
                if os.stat(where).st_ino == self.inode:
                    os.unlink(where)
            except OSError:
                pass

    try:
        if kind == "unix":
            server = UnixServer(where, Handler)
        else:
            server = TcpServer(("127.0.0.1", where), Handler)
    except OSError as error:
        raise UsageError(f"cannot listen on {options['address']!r}: {error.strerror or error}",
                         "choose another port or socket path") from None
    server.stopping = threading.Event()
    return server


def _clear_stale_socket(path: str):
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


def _check_message(message) -> str:
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

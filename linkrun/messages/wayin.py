"""The way in's sender (§4): the told message's signature and its one POST.

The supervisor and the sweep import this module only when they tell, and it
must stay small: stdlib only, and every module that only one path needs
(hashlib, email.utils, ...) is imported inside the function that needs it. Of
ours it imports `linkrun.errors` and `linkrun.address`. The message itself is
`linkrun.messages.told`; the stand-in way in that checks it is `linkrun.messages.standin`.
"""

from __future__ import annotations

import os
import socket
import stat
import time

from collections.abc import Callable

from ..address import AGENT_ID, parse_address
from ..errors import LinkRunError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Final, Literal

    OutcomeName = Literal["told", "not reached", "given up"]

# Module constants so that a test may lower them (§4: connect 2 s, whole request 10 s).
CONNECT_TIMEOUT = 2.0
REQUEST_TIMEOUT = 10.0
_KEY_MAX = 65536
_HEAD_MAX = 65536


# -- the signature and the key ----------------------------------------------

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


# -- sending -----------------------------------------------------------------

class DeliveryOutcome:
    """A delivery's outcome. Told and given up are written as the record's
    `told` (records.Told) as they are; not reached is tried again."""

    TOLD: Final = "told"
    NOT_REACHED: Final = "not reached"  # try again later
    GIVEN_UP: Final = "given up"  # final


class Delivery:
    """The outcome of `send` (DeliveryOutcome), with `retry_after` seconds when a way
    in not reached said when to try again; `detail` is one line for the log."""

    __slots__ = ("outcome", "retry_after", "detail")

    def __init__(self, outcome: OutcomeName, retry_after: float | None = None, detail: str = ""):
        self.outcome = outcome
        self.retry_after = retry_after
        self.detail = detail

    def __repr__(self) -> str:
        return f"Delivery(outcome={self.outcome!r}, retry_after={self.retry_after!r}, detail={self.detail!r})"


class _Unreached(Exception):
    """The request did not get an answer: refused, timed out, cut off."""


def send(way_in: str, agent: str, keyring: str, body: bytes, now: Callable[[], float] = time.time) -> Delivery:
    """One message to the way in, as §4 says; a 401 is tried once more with a
    fresh Link-Date (and the key read again: it may just have been replaced).

    Never raises for a delivery problem: the outcome says what to do. A
    request that timed out may still have been delivered; sending it again is
    safe because the way in drops a repeated `from`.
    """
    try:
        address = parse_address(way_in)
    except LinkRunError as error:
        return Delivery(DeliveryOutcome.GIVEN_UP, None, str(error))
    if not AGENT_ID.fullmatch(agent):
        return Delivery(DeliveryOutcome.GIVEN_UP, None, f"the agent id {agent!r} is not of the form [A-Za-z0-9._-]+")
    if not os.path.isabs(keyring):
        # A detached supervisor's working folder is no one's choice: a relative keyring is a bug.
        return Delivery(DeliveryOutcome.GIVEN_UP, None, f"the keyring {keyring!r} is not an absolute path; give the record an absolute keyring")
    for attempt in (1, 2):
        try:
            key = read_key(keyring, agent)
        except LinkRunError as error:  # the user's to mend, as serve says: tried again, as an unreached way in is
            return Delivery(DeliveryOutcome.NOT_REACHED, None, str(error))
        date = str(int(now()))
        try:
            status, reason, retry_after, said = _post(address, agent, date, signature(key, agent, date, body), body)
        except _Unreached as error:
            return Delivery(DeliveryOutcome.NOT_REACHED, None, f"{error} ({way_in})")
        detail = f"{status} {reason}".strip() + (f": {said}" if said else "") + f" ({way_in})"
        if 200 <= status < 300:
            return Delivery(DeliveryOutcome.TOLD, None, detail)
        if status in (408, 429) or 500 <= status < 600:
            return Delivery(DeliveryOutcome.NOT_REACHED, retry_after if status in (429, 503) else None, detail)
        if status == 401 and attempt == 1:
            continue
        if status == 401:
            detail = "refused twice, " + detail + "; check that the way in holds this agent's key and that the clocks agree"
        return Delivery(DeliveryOutcome.GIVEN_UP, None, detail)
    raise AssertionError("unreachable")


def _post(address: tuple[str, Any, str], agent: str, date: str, sign: str,
          body: bytes) -> tuple[int, str, float | None, str]:
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


def _read_head(sock: socket.socket, left: Callable[[], float]) -> tuple[int, str, dict[str, str], bytes]:
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
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, (parts[2] if len(parts) > 2 else "").strip(), headers, rest


def _read_some(sock: socket.socket, left: Callable[[], float], rest: bytes, headers: dict[str, str]) -> str:
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

"""JSON-RPC framing on stdio: one JSON document a line, orjson, one writer thread.

orjson is loaded with the tool layer (`Channel.use_orjson`), after the first
answer: its import (uuid and platform with it) was 2 ms of that answer's 40.
Until then the standard library's json reads and writes, by orjson's rules.
Knows no method and no tool. Stdout carries protocol messages only: the
channel keeps a private copy of fd 1 and points fd 1 at stderr, so a stray
print or a library warning can never corrupt the stream.
"""

from __future__ import annotations

import functools
import json
import os
import select
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TypeGuard

from ..kernel import write_all

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# A line longer than this is refused whole (a 10 MB `input` fits easily).
MAX_LINE = 64 * 1024 * 1024

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
UNSUPPORTED_VERSION = -32022


class Channel:
    """Stdin read by a thread that hands each line on at once, stdout written by a writer thread with its queue.

    `send` never waits for the client to read: a call's thread, a timeout and
    the session go on while stdout is full. Nothing queued is dropped, except a
    message sent with a `replaces` key, which takes the place of an unwritten
    one of the same key (progress: only the latest matters). Once stdout is
    gone, `lines` ends, even while stdin stays open.
    """

    def __init__(self, in_fd: int = 0, out_fd: int = 1):
        self._out = os.dup(out_fd)
        self._out_is_pipe = stat.S_ISFIFO(os.fstat(self._out).st_mode)
        os.set_inheritable(self._out, False)
        os.dup2(2, out_fd)
        self._in = open(in_fd, "rb", buffering=1 << 16, closefd=False)
        self._arrived = threading.Condition(threading.RLock())  # re-entrant: see interrupt
        self._eof = False  # stdin ended (or its thread stopped)
        self._handling = threading.Lock()  # held while a line is handled (serve_lines)
        self._reader: int | None = None  # the thread handling a line, while it does
        self._left: Callable[[], object] | None = None  # what `handle` left for the thread that read its line
        self._lines: Iterator[bytes | None] = self._stdin_lines()  # read by one thread at a time
        self._pass_on: Callable[[Callable[[], None]], None] | None = None  # serve_lines's
        self._stopped = False  # no more lines are handled
        self._ready = threading.Condition()
        self._queue: deque[list[Any]] = deque()  # [line, key] entries, in order
        self._replaceable: dict[object, list[Any]] = {}  # key -> its entry, while unwritten
        self._writing = False
        self._moved_at = time.monotonic()  # when bytes last went out
        self.closed = False  # stdout went away, or we stopped answering
        self.interrupted = False  # a signal asked us to stop reading
        self._orjson: ModuleType | None = None  # until then, the standard library (use_orjson)
        threading.Thread(target=self._write_queued, daemon=True, name="stdout").start()

    def serve_lines(self, handle: Callable[[bytes | None], None],
                    pass_on: Callable[[Callable[[], None]], None] | None = None) -> None:
        """Hand each non-blank line without its line ending (an over-long one
        as None) to `handle`, in order, on the thread that read it, as soon as
        it is read: no other thread is woken between a request's read and its
        handling. What `handle` leaves for that thread (`leave_for_reader`)
        runs on it once `pass_on` gave the reading to another: a call starts
        where its request was read. Returns at stdin's end, once stdout is
        gone, or when interrupted, with no `handle` running and none to come."""
        self._pass_on = pass_on
        threading.Thread(target=self._read_and_handle, args=(handle,), daemon=True, name="stdin").start()
        with self._arrived:
            self._arrived.wait_for(lambda: self._eof or self.closed or self.interrupted)
        with self._handling:
            self._stopped = True

    def leave_for_reader(self, job: Callable[[], object]) -> bool:
        """From `handle`: run `job` on this thread once the reading went on
        elsewhere; False (nothing is left) when this thread reads no line."""
        if self._pass_on is None or self._reader != threading.get_ident():
            return False
        self._left = job
        return True

    def _read_and_handle(self, handle: Callable[[bytes | None], None]) -> None:
        ended = True  # False once the reading went to another thread
        try:
            for line in self._lines:
                with self._handling:
                    if self._stopped or self.closed:
                        return
                    self._reader = threading.get_ident()
                    try:
                        handle(line)
                    finally:
                        self._reader, left, self._left = None, self._left, None
                if left is not None:
                    assert self._pass_on is not None  # left only with it
                    self._pass_on(functools.partial(self._read_and_handle, handle))
                    ended = False
                    left()
                    return
        finally:
            if ended:
                with self._arrived:
                    self._eof = True
                    self._arrived.notify_all()

    def _stdin_lines(self) -> Iterator[bytes | None]:
        while True:
            line = self._in.readline(MAX_LINE)
            if not line:
                return
            if not line.endswith(b"\n") and len(line) == MAX_LINE:
                while (rest := self._in.readline(MAX_LINE)) and not rest.endswith(b"\n"):
                    pass
                yield None
                continue
            line = line.rstrip(b"\r\n")
            if line.strip():
                yield line

    def use_orjson(self) -> None:
        """From now on, orjson reads and writes every message."""
        import orjson

        self._orjson = orjson

    def loads(self, line: bytes) -> object:
        """One message; ValueError (orjson's JSONDecodeError is one) when the line
        is not JSON, or holds a lone surrogate ("surrogate in string")."""
        if self._orjson is not None:
            return self._orjson.loads(line)
        try:
            message = standard_loads(line.decode())  # strict UTF-8, as orjson reads
        except RecursionError:
            raise ValueError("depth limit exceeded") from None
        if b"\\u" in line:  # only an escape makes a lone surrogate; encoding finds one at C speed
            try:
                json.dumps(message, ensure_ascii=False).encode()
            except UnicodeEncodeError:
                raise ValueError("lone surrogate in string") from None
        return message

    def _dumps(self, message: object) -> bytes:
        if self._orjson is not None:
            line: bytes = self._orjson.dumps(message)
            return line
        return json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()

    def send(self, message: object, replaces: object = None) -> bool:
        """Queue one message as one line; False once stdout is gone."""
        line = self._dumps(message) + b"\n"
        with self._ready:
            if self.closed:
                return False
            queued = self._replaceable.get(replaces) if replaces is not None else None
            if queued is not None:
                queued[0] = line  # same place in the queue: still before what followed it
                return True
            if not self._queue and not self._writing and self._room_for(line):
                self._write_now(line)  # the writer thread's hop saved, the order kept
                return True
            entry = [line, replaces]
            self._queue.append(entry)
            if replaces is not None:
                self._replaceable[replaces] = entry
            self._ready.notify_all()
        return True

    def _room_for(self, line: bytes) -> bool:
        """True when stdout takes `line` without waiting: a pipe with a slot
        free takes up to PIPE_BUF bytes whole (a full one, or anything else, goes through the queue)."""
        if len(line) > select.PIPE_BUF or not self._out_is_pipe:
            return False
        poll = select.poll()
        poll.register(self._out, select.POLLOUT)
        return bool(poll.poll(0))

    def _write_now(self, line: bytes) -> None:
        """Under `_ready` (re-entrant: `close` takes it again): one line written by the sending thread."""
        try:
            write_all(self._out, line, self._moved)
        except OSError:  # EPIPE and the like: the client is gone
            self.close()

    def flush(self, idle: float) -> None:
        """Wait until everything queued is written, or until no byte went out for `idle` seconds."""
        with self._ready:
            self._moved_at = max(self._moved_at, time.monotonic())
            while not self.closed and (self._queue or self._writing):
                left = self._moved_at + idle - time.monotonic()
                if left <= 0:
                    return  # the client reads no more: do not wait on it
                self._ready.wait(left)

    def interrupt(self) -> None:
        """Make `serve_lines` end at once (once a line being handled is). Safe in a signal
        handler: the lock is re-entrant, so the handler takes it even when it interrupted its holder."""
        with self._arrived:
            self.interrupted = True
            self._arrived.notify_all()

    def close(self) -> None:
        with self._ready:
            self.closed = True
            self._queue.clear()
            self._replaceable.clear()
            self._ready.notify_all()
        with self._arrived:
            self._arrived.notify_all()

    def _moved(self) -> None:
        self._moved_at = time.monotonic()

    def _write_queued(self) -> None:
        while (line := self._next_line()) is not None:
            try:
                write_all(self._out, line, self._moved)
            except OSError:  # EPIPE and the like: the client is gone
                self.close()
            with self._ready:
                self._writing = False
                self._ready.notify_all()

    def _next_line(self) -> bytes | None:
        with self._ready:
            while not self._queue and not self.closed:
                self._ready.wait()
            if self.closed:
                return None
            line: bytes
            line, key = self._queue.popleft()
            if key is not None:
                del self._replaceable[key]
            self._writing = True
            return line


def standard_loads(text: str | bytes) -> object:
    """The standard library's json, by orjson's rules: NaN, Infinity and
    numbers past a double refused, integers past 64 bits read as floats."""
    def constant(name: str) -> object:
        raise ValueError(name)

    def integer(text: str) -> int | float:
        value = int(text)
        return value if -2**63 <= value < 2**64 else float(value)

    def real(text: str) -> float:
        value = float(text)
        if value in (float("inf"), float("-inf")):
            raise ValueError(f"{text} is past a double")
        return value

    return json.loads(text, parse_constant=constant, parse_int=integer, parse_float=real)


def lenient_loads(line: bytes, problem: ValueError) -> object:
    """A line refused only for a lone surrogate escape (`"\\ud800"`: JSON's
    grammar allows it, UTF-8 cannot carry it), read by the standard library,
    so that the request is answered by its id; raises `problem` for any other
    line. Only that line pays: every other line is read once."""
    if "surrogate in string" not in str(problem):
        raise problem
    try:
        return standard_loads(line)
    except (ValueError, RecursionError):
        raise problem from None


def lone_surrogate(value: object, path: str = "") -> str | None:
    """Where the first string holding a lone surrogate sits in a decoded
    message (`params.arguments.args[1]`, or `a key of params`); None when none does."""
    if isinstance(value, str):
        return path if any(0xD800 <= ord(c) <= 0xDFFF for c in value) else None
    if isinstance(value, list):
        items = enumerate(value)
        return next((found for at, item in items if (found := lone_surrogate(item, f"{path}[{at}]"))), None)
    if isinstance(value, dict):
        for key, item in value.items():
            if lone_surrogate(key) is not None:
                return f"a key of {path or 'the message'}"
            found = lone_surrogate(item, f"{path}.{key}" if path else key)
            if found is not None:
                return found
    return None


RequestId = str | int  # as the session accepts them


def is_id(value: object) -> TypeGuard[RequestId]:
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def error(request_id: object, code: int, message: str, data: object = None) -> dict[str, Any]:
    body: dict[str, object] = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": body}


def result(request_id: object, value: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def lone_surrogate_refused(message: object) -> dict[str, Any] | None:
    """The answer to a message holding a lone surrogate (a line orjson
    refused): never run, as no answer, record or log could write the text
    back; refused by its own id as invalid params, naming where it sits. A
    notification or a response of the client's is not answered; an id that
    holds one cannot be written back, and gets id null."""
    where = lone_surrogate(message) or "the message"
    where = where.replace("params.arguments.", "the argument ", 1).replace("params.arguments", "the arguments", 1)
    text = (f"{where} holds a lone surrogate (an escape such as \\ud800 without its pair), which is not text: "
            "send the text itself, as UTF-8")
    if isinstance(message, dict) and ("method" not in message or "id" not in message):
        return None
    request_id = message.get("id") if isinstance(message, dict) else None
    if not is_id(request_id) or lone_surrogate(request_id) is not None:
        return error(None, INVALID_REQUEST, text)
    return error(request_id, INVALID_PARAMS, text)

"""JSON-RPC framing on stdio: one JSON document a line, orjson, one write lock.

Knows no method and no tool. Stdout carries protocol messages only: the
channel keeps a private copy of fd 1 and points fd 1 at stderr, so a stray
print or a library warning can never corrupt the stream.
"""

from __future__ import annotations

import os
import threading

import orjson

# A line longer than this is refused whole (a 10 MB `input` fits easily).
MAX_LINE = 64 * 1024 * 1024

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
UNSUPPORTED_VERSION = -32022


class Channel:
    def __init__(self, in_fd: int = 0, out_fd: int = 1):
        self._out = os.dup(out_fd)
        os.set_inheritable(self._out, False)
        os.dup2(2, out_fd)
        self._in = open(in_fd, "rb", buffering=1 << 16, closefd=False)
        self._lock = threading.Lock()
        self.closed = False  # stdout went away, or we stopped answering

    def lines(self):
        """Yield each non-blank line without its line ending; over-long ones as None."""
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

    def send(self, message) -> bool:
        """Write one message as one line; False once stdout is gone."""
        data = orjson.dumps(message) + b"\n"
        with self._lock:
            if self.closed:
                return False
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._out, view):]
            except (BrokenPipeError, OSError):
                self.closed = True
                return False
        return True

    def close(self):
        with self._lock:
            self.closed = True


def error(request_id, code: int, message: str, data=None) -> dict:
    body = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": body}


def result(request_id, value: dict) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "result": value}

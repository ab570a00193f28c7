"""A way in's address and an agent's id: the rules that the flag checks, the
sender and the stand-in share. Imports only `linkrun.errors`, so that the
lowest module can use it."""

from __future__ import annotations

import os
import re

from .errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Matched whole (fullmatch): `$` would let a trailing newline through.
AGENT_ID = re.compile(r"[A-Za-z0-9._-]+")
_HTTP = re.compile(r"http://127\.0\.0\.1:(\d{1,5})(/[\x21-\x7e]*)?")
# sun_path holds 108 bytes with the final NUL.
_UNIX_PATH_MAX = 107


def parse_address(text: str, listening: bool = False) -> tuple[str, Any, str]:  # Any: a port or a path, by kind
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

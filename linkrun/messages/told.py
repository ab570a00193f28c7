"""The told message of §4: its text and its POST body. Pure: it reads nothing
but the record and the output's last bytes it is given.

The program's output goes into a message that the agent reads as a message
of its conversation, so it must never pass for the user's words: the text
frames it between markers that carry a nonce made after the program ended,
which nothing in the output can know (see `_nonce`).

The supervisor imports this module only when it tells: stdlib only, and
json and datetime are imported inside the functions that need them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from ..state.records import State, killed_by_limit, limit_words
from ..units import elapsed, format_duration, killed_by_note, local_time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..state.records import Record


def told_text(record: Record, last_bytes: bytes) -> str:
    """The message of §4 for an ended `record`.

    `last_bytes` are the last bytes of the command's output, read by the
    caller (any length); the last `record["output"] // 2` of them are shown,
    without a character cut at their start.
    """
    from ..processes.capture import utf8_tail

    id_ = record["id"]
    command = shown_command(record["program"], record.get("args", []))
    first = f"Background command {id_} ({command}, started {local_time(record['started'])}) {_ending(record)}"
    if record["state"] == State.FAILED_TO_START:
        return first + "."
    total = int(record.get("bytes") or 0)
    dropped = int(record.get("kept_from") or 0)
    ran = ("ran at least " if record["state"] == State.LOST else "ran ") + elapsed(_seconds(record))
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


def _ending(record: Record) -> str:
    limit = {"memory": "; it reached its memory limit, and the out-of-memory killer killed it",
             "allocation": "; it likely reached its memory limit, and an allocation was refused",
             "tasks": "; it reached its task limit, and a fork or a new thread was refused",
             "cpu": "; it used up its CPU time, and the kernel killed it with SIGXCPU",
             "file": "; it reached the largest file it may write ([limits] file), and a write past it was refused"}
    return _state_ending(record) + limit.get(limit_words(record), "")


def _state_ending(record: Record) -> str:
    state = record["state"]
    if state == State.EXITED:
        if record.get("signal"):
            return f"was killed by {record['signal']}"
        status = record.get("exit")
        return f"exited with status {status}" + killed_by_note(status, sure=killed_by_limit(record.get("limit"), status))
    if state == State.TIMED_OUT:
        return f"timed out after {format_duration(record['timeout'])}"
    if state == State.STOPPED:
        return "was stopped"
    if state == State.LOST:
        return "was lost: the agent or the computer stopped while it ran"
    if state == State.FAILED_TO_START:
        return "could not be started (its supervisor died before it ran; nothing ran)"
    return f"ended {state}"


def _seconds(record: Record) -> float:
    ended = record.get("ended")
    return max(0.0, float(ended) - float(record["started"])) if ended is not None else 0.0


_PLAIN_WORD = re.compile(r"[\w@%+=:,./-]+", re.ASCII)
# Newline, tab and CR as bash's $'...' also reads them: a script's lines read better than as \x0a.
_SHORT_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def shown_command(program: str, args: Sequence[str]) -> str:
    """A command line on one line, each word as a shell would need it (the
    told messages, and `list`): a multi-line script cannot break a layout."""
    return " ".join(shown_word(word) for word in [program, *args])


def shown_word(word: str) -> str:
    """A word as a shell would need it; control characters as bash's $'...' escapes,
    so an argument can never break the first line (a command's words, a pattern as it was given)."""
    if _PLAIN_WORD.fullmatch(word):
        return word
    if not word.isprintable():
        escaped = "".join("\\" + c if c in "'\\" else c if c.isprintable() else _SHORT_ESCAPES.get(c) or _escape(c)
                          for c in word)
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


# -- the body -----------------------------------------------------------------

def body(record: Record, text: str) -> bytes:
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

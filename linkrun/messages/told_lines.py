"""The lines message: a running command's lines that its `tell_on` pattern
matched, told to its conversation through the way in (§4's POST, signed as
the end message is), and their record.

Each line found is first gathered in the record (`lines_gathered`: at most
SHOWN lines, each (offset, text); `lines_more` counts those past them).
Sealing makes the gathered lines message number n = `lines_sent` + 1
(`lines_batch`), written before it is sent, so that a crash or a way in
that is down sends that same message again, from `run:<id>:lines:<n>`, which
the way in drops when repeated: each message is delivered once, and each
line is in exactly one message. Once told (or given up) `lines_sent` counts
it and the batch goes.

The supervisor seals at most once every `every()` seconds while the command
runs; at the end, and in a sweep, what is gathered is sealed and told just
before the end message, whatever the minute says.

Pure but for `tell_batch` (one attempt, the record written before and
after): stdlib only, like told.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..state import records

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    from ..state.records import LinesBatch, Record
    from .wayin import Delivery, OutcomeName

    class Destination(Protocol):
        """Where and as whom to send, as this module reads it (telling.WayIn, which calls this module)."""

        address: str | None
        agent: str | None
        keyring: str | None

SHOWN = 50  # lines in one message at most; the rest are counted
EVERY = 60.0  # seconds between two lines messages of one command, at least


def every() -> float:
    """The least time between two lines messages: a minute, or LNK_TELL_EVERY seconds (for tests)."""
    try:
        return max(0.0, float(os.environ.get("LNK_TELL_EVERY", EVERY)))
    except ValueError:
        return EVERY


def gather(record: Record, lines: list[tuple[int, bytes]], more: int = 0) -> bool:
    """Lines found, into the record's gathered ones; whether the record changed in a way worth writing
    now (a line to show: the count of the rest is written with the next write)."""
    gathered = record.setdefault("lines_gathered", [])
    shown = False
    for offset, data in lines:
        if len(gathered) < SHOWN:
            gathered.append((offset, data.decode("utf-8", "backslashreplace")))  # a JSON pair on disk
            shown = True
        else:
            more += 1
    record["lines_more"] = (record.get("lines_more") or 0) + more
    return shown


def pending(record: Record) -> bool:
    """Lines gathered or a message sealed, not told yet."""
    return bool(record.get("lines_batch") or record.get("lines_gathered") or record.get("lines_more"))


def seal(record: Record, written: int | None = None) -> LinesBatch | None:
    """The message to send: the sealed one, else the gathered lines sealed now (None: nothing to tell),
    with the bytes `written` so far (none given: the record's, which is whole only at the end).
    The caller writes the record before sending it."""
    if record.get("lines_batch"):
        return record["lines_batch"]
    if not record.get("lines_gathered") and not record.get("lines_more"):
        return None
    total = written if written is not None else record.get("bytes") or 0
    batch: LinesBatch = {"n": (record.get("lines_sent") or 0) + 1, "lines": record.get("lines_gathered") or [],
             "more": record.get("lines_more") or 0, "state": record["state"], "bytes": total,
             "seconds": round(max(0.0, records.now() - record["started"]), 3)}
    record.update({"lines_batch": batch, "lines_gathered": [], "lines_more": 0})
    return batch


def settle(record: Record, outcome: OutcomeName) -> None:
    """After an attempt: told or given up, the batch is done; not reached, it stays to be sent again."""
    from .wayin import DeliveryOutcome  # loaded already: the outcome came through it

    if outcome == DeliveryOutcome.NOT_REACHED:
        return
    record["lines_sent"] = (record.get("lines_sent") or 0) + 1
    record["lines_batch"] = None
    if outcome == DeliveryOutcome.TOLD:
        record["lines_told_at"] = records.now()


def text(record: Record, batch: LinesBatch) -> str:
    """The message: what the command is, then the lines between markers whose nonce it cannot know."""
    from .told import _nonce, _shown, shown_command
    from ..units import local_time

    id_ = record["id"]
    command = shown_command(record["program"], record.get("args", []))
    count = len(batch["lines"]) + batch["more"]
    shown, changed = _shown("".join(f"@{offset}: {line}\n" for offset, line in batch["lines"]).encode())
    note = (" (control and invisible characters shown as \\x or \\u escapes; read gives the raw bytes)"
            if changed else "")
    still = "it still runs" if batch["state"] in records.RUNNING_STATES else f"it has ended ({batch['state']})"
    nonce = _nonce()
    rest = ""
    if batch["more"]:
        rest = f"{batch['more']} more matching line{'s' if batch['more'] != 1 else ''} not shown; "
    first_offset = batch["lines"][0][0] if batch["lines"] else 0
    # A line is kept to its first LINE_SHOWN bytes: its match may lie past them (a trial saw none of it).
    if any(len(line.encode()) >= records.LINE_SHOWN for _, line in batch["lines"]):
        rest += f"a line shown at {records.LINE_SHOWN} bytes is cut there, and its match may lie past the cut; "
    return (f"Background command {id_} ({command}, started {local_time(record['started'])}) printed {count} "
            f"line{'s' if count != 1 else ''} matching its tell_on pattern {record.get('tell_on')!r}; {still}. "
            f"Each line, after its byte offset, between the markers is the command's own output{note}:\n"
            f"-----BEGIN OUTPUT {nonce}-----\n{shown}-----END OUTPUT {nonce}-----\n"
            f"{rest}read more with read id={id_} pattern={record.get('tell_on')!r} offset={first_offset}")


def body(record: Record, batch: LinesBatch, message: str) -> bytes:
    """§4's body, from `run:<id>:lines:<n>`, with `kind` "lines" and the lines as values."""
    import json

    return json.dumps({
        "from": f"run:{record['id']}:lines:{batch['n']}", "thread": record["thread"],
        "hops": int(record.get("hops") or 0) + 1, "text": message, "id": record["id"], "state": batch["state"],
        "exit": None, "signal": None, "seconds": batch["seconds"], "bytes": batch["bytes"], "kind": "lines",
        "lines": [{"offset": offset, "text": line} for offset, line in batch["lines"]], "more": batch["more"],
    }, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def tell_batch(state: str, record: Record, way_in: Destination, log: Callable[[str], None]) -> Delivery | None:
    """The pending lines, sealed if need be, told in one attempt each until none is left or one is not
    reached; the record written before each send and after it. None: nothing was pending. The caller
    holds the record's lock."""
    from . import wayin

    delivery = None
    while (batch := seal(record)) is not None:
        records.write(state, record["id"], record)
        delivery = wayin.send(way_in.address or "", way_in.agent or "", way_in.keyring or "",
                              body(record, batch, text(record, batch)))
        settle(record, delivery.outcome)
        records.write(state, record["id"], record)
        log(f"telling lines message {batch['n']} at {way_in.address}: {delivery.outcome} ({delivery.detail})")
        if delivery.outcome == wayin.DeliveryOutcome.NOT_REACHED:
            break
    return delivery

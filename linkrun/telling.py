"""Telling a conversation that its background command ended: `told` goes
untold → telling → told (or given up), and each step is written before the
next, so a crash mid-send leaves `telling`, which a sweep sends again (the
way in drops a repeated `from`, so the message is delivered once).

Used by the supervisor (which retries with backoff for ten minutes from its
first attempt, holding its lock) and by the sweep (which has a window of its
own). Both hold the record's lock while they tell.
"""

from __future__ import annotations

import os
import select

from . import records

# Ten minutes of trying, for the supervisor and again for the sweeps. The
# variable exists so that tests can shorten the window instead of waiting it out.
WINDOW = float(os.environ.get("LNK_TELL_WINDOW", "600"))
BACKOFF_MAX = 60.0


class WayIn:
    """Where and as whom to send: a record's own, or the one a sweep was given."""

    def __init__(self, address: str | None, agent: str | None, keyring: str | None):
        self.address, self.agent, self.keyring = address, agent, keyring

    @classmethod
    def of(cls, record: dict) -> WayIn:
        return cls(record.get("way_in"), record.get("as"), record.get("keyring"))


def last_bytes(record: dict) -> bytes:
    """The end of the command's output for the message, read without following a link."""
    from .outfile import open_background

    want = max(0, int(record.get("output") or 0) // 2)
    try:
        folder = open_background(record["files"])
    except OSError:
        return b""
    try:
        fd = os.open(f"{record['id']}.out", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        return b""
    finally:
        os.close(folder)
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, min(want, size), max(0, size - want))
    finally:
        os.close(fd)


class _NoWayIn:
    outcome, retry_after, detail = "given up", None, "no way in to tell"


def tell_once(state: str, record: dict, way_in: WayIn, log):
    """One attempt, the record's `told` written before and after; returns the
    Delivery (its `outcome`: "told", "not reached" or "given up").

    The caller holds the record's lock.
    """
    from . import wayin

    if not way_in.address or not way_in.agent:
        record["told"] = "given up"
        records.write(state, record["id"], record)
        log("no way in to tell: given up")
        return _NoWayIn()
    record["told"] = "telling"
    records.write(state, record["id"], record)
    text = wayin.told_text(record, last_bytes(record))
    delivery = wayin.send(way_in.address, way_in.agent, way_in.keyring or "", wayin.body(record, text))
    if delivery.outcome == "told":
        record.update(told="told", told_at=records.now())
    elif delivery.outcome == "given up":
        record["told"] = "given up"
    else:
        record["told"] = "untold"
    records.write(state, record["id"], record)
    log(f"telling {way_in.address}: {delivery.outcome} ({delivery.detail})")
    return delivery


def tell_from_supervisor(state: str, command_id: str, record: dict, log, wake_fd: int | None = None,
                         stopping=lambda: False) -> None:
    """Step 9: tell, retrying with backoff (1, 2, 4 … 60 s) for ten minutes from the
    first attempt; then leave it untold for the sweeps. A signal (the agent's
    service stopping) ends the retries at once."""
    delay = 1.0
    while True:
        if record.get("first_try") is None:
            record["first_try"] = records.now()
        delivery = tell_once(state, record, WayIn.of(record), log)
        if delivery.outcome != "not reached":
            return
        elapsed = records.now() - min(record["first_try"], records.now())
        if elapsed >= WINDOW or stopping():
            log("the way in stayed unreachable: left untold for a sweep")
            return
        pause = min(max(delay, delivery.retry_after or 0), BACKOFF_MAX, WINDOW - elapsed)
        delay = min(delay * 2, BACKOFF_MAX)
        if wake_fd is not None:
            if select.select([wake_fd], [], [], pause)[0]:  # a signal's byte wakes us early
                try:
                    os.read(wake_fd, 512)
                except BlockingIOError:
                    pass
        else:
            select.select([], [], [], pause)
        if stopping():
            log("stopping while the way in is unreachable: left untold for a sweep")
            return

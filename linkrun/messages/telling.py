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
import time
from collections.abc import Callable

import orjson

from ..state import filing, layout, records
from ..state.records import Told

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..state.records import Record
    from typing import Final

    from .wayin import Delivery

# Ten minutes of trying, for the supervisor and again for the sweeps. The
# variable exists so that tests can shorten the window instead of waiting it out.
WINDOW = float(os.environ.get("LNK_TELL_WINDOW", "600"))
BACKOFF_MAX = 60.0


class WayIn:
    """Where and as whom to send: a record's own, or the one a sweep was given."""

    def __init__(self, address: str | None, agent: str | None, keyring: str | None):
        self.address, self.agent, self.keyring = address, agent, keyring

    @classmethod
    def of(cls, record: Record) -> WayIn:
        return cls(record.get("way_in"), record.get("as"), record.get("keyring"))


class _NoWayIn:
    outcome: Final = Told.GIVEN_UP
    retry_after, detail = None, "no way in to tell"


def tell_once(state: str, record: Record, way_in: WayIn, log: Callable[[str], None],
              last_bytes: Callable[[Record], bytes]) -> Delivery | _NoWayIn:
    """One attempt, the record's `told` written before and after; returns the
    Delivery (its `outcome`: wayin.DeliveryOutcome).
    `last_bytes(record)` reads the end of the command's output for the
    message (outread.last_bytes: the output file is the background room's).

    The caller holds the record's lock.
    """
    from . import told, told_lines, wayin

    if not way_in.address or not way_in.agent:
        record["told"] = Told.GIVEN_UP
        records.write(state, record["id"], record)
        log("no way in to tell: given up")
        return _NoWayIn()
    if told_lines.pending(record):  # the lines a tell_on pattern matched, told before the end
        lines = told_lines.tell_batch(state, record, way_in, log)
        if lines is not None and lines.outcome == wayin.DeliveryOutcome.NOT_REACHED:
            return lines
    record["told"] = Told.TELLING
    records.write(state, record["id"], record)
    text = told.told_text(record, last_bytes(record))
    delivery = wayin.send(way_in.address, way_in.agent, way_in.keyring or "", told.body(record, text))
    if delivery.outcome == wayin.DeliveryOutcome.TOLD:
        record.update({"told": Told.TOLD, "told_at": records.now()})
    elif delivery.outcome == wayin.DeliveryOutcome.GIVEN_UP:
        record["told"] = Told.GIVEN_UP
    else:
        record["told"] = Told.UNTOLD
    records.write(state, record["id"], record)
    log(f"telling {way_in.address}: {delivery.outcome} ({delivery.detail})")
    return delivery


def tell_from_supervisor(state: str, command_id: str, record: Record, log: Callable[[str], None],
                         last_bytes: Callable[[Record], bytes], wake_fd: int | None = None,
                         stopping: Callable[[], bool] = lambda: False,
                         poll_every: Callable[[], float | None] = lambda: None) -> None:
    """Step 9: tell, retrying with backoff (1, 2, 4 … 60 s, or the way in's
    Retry-After) for ten minutes from the first attempt; then leave it untold
    for the sweeps. A signal (the agent's service stopping) ends the retries
    at once; a sweep's wake file makes the next try come at once, at the way
    in it names, but never before a Retry-After the way in gave has ended.

    `wake_fd` is readable when a signal came or the state folder changed;
    `poll_every()` is how often to look for a wake file when nothing watches
    the folder (None while something does)."""
    from . import wayin  # loaded by the first attempt, before it is read here
    way_in = WayIn.of(record)
    delay = 1.0
    try:
        while True:
            first_try = record.get("first_try")
            if first_try is None or first_try > records.now():  # or the clock went back
                first_try = record["first_try"] = records.now()
            delivery = tell_once(state, record, way_in, log, last_bytes)
            if delivery.outcome != wayin.DeliveryOutcome.NOT_REACHED:
                return
            elapsed = records.now() - first_try
            if elapsed >= WINDOW or stopping():
                log("the way in stayed unreachable: left untold for a sweep")
                return
            pause = min(max(delay, delivery.retry_after or 0), BACKOFF_MAX, WINDOW - elapsed)
            delay = min(delay * 2, BACKOFF_MAX)
            floor = min(delivery.retry_after or 0, pause)
            woken = _wait(state, command_id, pause, wake_fd, stopping, poll_every, floor)
            if stopping():
                log("stopping while the way in is unreachable: left untold for a sweep")
                return
            if woken is not None:
                way_in = woken if woken.address else way_in
                kept = f" (kept until the way in's Retry-After of {floor:g} s ended)" if floor else ""
                log(f"woken by a sweep{kept}: trying {way_in.address} at once")
    finally:
        _unlink(wake_path(state, command_id))  # one that came too late has nothing left to wake


def _wait(state: str, command_id: str, pause: float, wake_fd: int | None, stopping: Callable[[], bool],
          poll_every: Callable[[], float | None], floor: float = 0.0) -> WayIn | None:
    """Sleep `pause` seconds; less only for a signal or a sweep's wake file,
    whose way in is returned. A wake never cuts short the first `floor`
    seconds (the way in's Retry-After, DESIGN §4 v4.1): one that comes
    within them is kept (the latest wins) and returned as they end. Any
    other wake (the watch thread's own byte, a change of another file) is
    no reason to try before the pause is over."""
    started = time.monotonic()
    deadline, woken = started + pause, None
    while True:
        woken = take_wake(state, command_id) or woken
        now = time.monotonic()
        left = (started + floor if woken is not None else deadline) - now
        if stopping() or left <= 0:
            return woken
        every = poll_every()
        step = left if every is None else min(left, every)
        ready = select.select([wake_fd] if wake_fd is not None else [], [], [], step)[0]
        if ready and wake_fd is not None:
            try:
                os.read(wake_fd, 512)
            except BlockingIOError:
                pass


# -- the wake file: a sweep to a supervisor backing off (§4) ---------------------------

WAKE_MAX = 64 * 1024


def wake_path(state: str, command_id: str) -> str:
    return layout.path(state, command_id, layout.WAKE)


def write_wake(state: str, command_id: str, way_in: WayIn) -> None:
    """`<id>.wake`, holding the way in to try: written beside, renamed into
    place whole (the latest sweep's way in wins)."""
    data = orjson.dumps({"way_in": way_in.address, "as": way_in.agent, "keyring": way_in.keyring})
    filing.write_whole(wake_path(state, command_id), data)


def take_wake(state: str, command_id: str) -> WayIn | None:
    """The way in of a wake file, which is removed; None when there is none.
    One that cannot be read still wakes, with no address: the caller tries
    the way in it had."""
    path = wake_path(state, command_id)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:
        _unlink(path)
        return WayIn(None, None, None)
    try:
        data = os.read(fd, WAKE_MAX)
    finally:
        os.close(fd)
        _unlink(path)
    try:
        given = orjson.loads(data)
    except orjson.JSONDecodeError:
        given = None
    if not isinstance(given, dict) or not all(isinstance(given.get(k), str) for k in ("way_in", "as", "keyring")):
        return WayIn(None, None, None)
    return WayIn(given["way_in"], given["as"], given["keyring"])


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

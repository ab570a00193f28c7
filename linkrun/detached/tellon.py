"""A supervisor's `tell_on`: the lines its pattern matches (linescan.py finds
them beside the pump) gathered in the record and told through the way in,
at most one message every `told_lines.every()` seconds (a minute), the
lines found meanwhile gathered into the next (told_lines.py: the message,
its record, why each is delivered once).

All of it runs on the supervisor's main thread, called from its loop at
each wake (step 6), but the POST itself: a thread sends the sealed message
and wakes the loop with its outcome, so the pump never waits on the way in.
While the way in cannot be reached, the same message is sent again with
backoff (1, 2, 4 … 60 s, or its Retry-After) for as long as the command
runs, and at once when a sweep's wake file comes (once a Retry-After
ended), as the end's telling does. At the end, what is left is told just
before the end message (telling.tell_once).

Loaded by a supervisor only when its record has a `tell_on` pattern.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from ..state import records
from .lines import LineFinder, compile_pattern
from .linescan import LineScan
from .literals import required_literals, starts_lines
from ..messages import told_lines
from ..messages.telling import BACKOFF_MAX, WayIn, take_wake

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..state.records import LinesBatch, Record
    from .outfile import OutputFile
    from ..messages.wayin import Delivery


class LineTeller:
    """The tell_on lines of one command; `record` is the supervisor's own dict, written here with
    records.write (a failed write is tried again at the next wake: the pump never waits for room)."""

    def __init__(self, state: str, record: Record, wake_fd: int, log: Callable[[str], None]) -> None:
        self.state, self.record, self.wake_fd, self.log = state, record, wake_fd, log
        pattern = record.get("tell_on")
        assert pattern is not None  # the supervisor makes a teller only for a record with tell_on
        finder = LineFinder(compile_pattern(pattern, whole_lines=False), 0, required_literals(pattern),
                            starts_lines(pattern))
        self.scan = LineScan(finder, self._wake, log)
        self.way_in = WayIn.of(record)
        self.sender: threading.Thread | None = None
        self.delivery: Delivery | None = None  # the sender's outcome, once it is done
        self.next_try = 0.0  # monotonic: no try of the sealed message before this
        self.floor = 0.0  # monotonic: the way in's Retry-After, which a wake never cuts short
        self.delay = 1.0
        self.dirty = False
        self.every = told_lines.every()
        self.output: OutputFile | None = None

    def attach(self, output: OutputFile) -> None:
        """Follow the output file from its first byte."""
        self.output = output  # its total is the message's bytes
        output.scan = self.scan
        self.scan.new_file(output.fd, output.kept_from)

    def _wake(self) -> None:
        try:
            os.write(self.wake_fd, b"l")
        except BlockingIOError:
            pass  # a wake is pending already

    def tick(self) -> float | None:
        """At each wake of the loop: take the lines found, settle a send that ended, seal or send again
        when due; how soon the next wake is wanted (None: not sooner than otherwise)."""
        found, more = self.scan.take()
        if (found or more) and told_lines.gather(self.record, found, more):
            self.dirty = True
        self._settle()
        if self.sender is None:
            self._send_when_due()
        if self.dirty:
            self._write()
        return self._soon()

    def finish(self) -> None:
        """The output ended: the last lines found, a send under way waited for. What is left is in the
        record, which the supervisor writes with the end, and told before the end message."""
        self.scan.finish()
        found, more = self.scan.take()
        told_lines.gather(self.record, found, more)
        if self.sender is not None:
            self.sender.join()
            self._settle()

    def _settle(self) -> None:
        if self.sender is None or self.sender.is_alive():
            return
        self.sender.join()
        self.sender, delivery = None, self.delivery
        assert delivery is not None  # set by the sender before it ends
        from ..messages.wayin import DeliveryOutcome  # loaded already: the sender sent through it
        batch = self.record["lines_batch"]
        assert batch is not None  # sealed before it was sent, and settled only here
        told_lines.settle(self.record, delivery.outcome)
        self.log(f"telling lines message {batch['n']} at {self.way_in.address}: {delivery.outcome} "
                 f"({delivery.detail})")
        if delivery.outcome == DeliveryOutcome.NOT_REACHED:
            now = time.monotonic()
            self.floor = now + (delivery.retry_after or 0)
            self.next_try = now + min(max(self.delay, delivery.retry_after or 0), BACKOFF_MAX)
            self.delay = min(self.delay * 2, BACKOFF_MAX)
        else:
            self.delay = 1.0
        self.dirty = True

    def _send_when_due(self) -> None:
        now = time.monotonic()
        if self.record.get("lines_batch"):
            woken = take_wake(self.state, self.record["id"])
            if woken is not None:
                self.way_in = woken if woken.address else self.way_in
                self.next_try = max(now, self.floor)
                self.log(f"woken by a sweep: the lines message is tried at {self.way_in.address} "
                         f"{'at once' if self.next_try <= now else 'once the Retry-After ends'}")
            if now >= self.next_try:
                self._send(self.record["lines_batch"])
        elif told_lines.pending(self.record) and self._since_told() >= self.every:
            self._send(told_lines.seal(self.record, self.output.total if self.output is not None else None))

    def _since_told(self) -> float:
        told_at = self.record.get("lines_told_at")
        return float("inf") if told_at is None else records.now() - min(told_at, records.now())

    def _send(self, batch: LinesBatch | None) -> None:
        """The sealed message, recorded before it goes (a crash then sends it again, once)."""
        assert batch is not None  # pending lines seal into a message
        if not self._write():
            return  # not recorded: not sent either (the next wake tries again)
        from ..messages import wayin

        body = told_lines.body(self.record, batch, told_lines.text(self.record, batch))
        address, agent, keyring = self.way_in.address or "", self.way_in.agent or "", self.way_in.keyring or ""

        def send() -> None:
            self.delivery = wayin.send(address, agent, keyring, body)
            self._wake()

        self.delivery = None
        self.sender = threading.Thread(target=send, name="tell lines", daemon=True)
        self.sender.start()

    def _write(self) -> bool:
        try:
            records.write(self.state, self.record["id"], self.record)
        except OSError as problem:
            self.log(f"cannot record the tell_on lines yet: {problem}")
            self.dirty = True
            return False
        self.dirty = False
        return True

    def _soon(self) -> float | None:
        """Seconds to the next thing due: a write to try again, a retry, or the gathered lines' message."""
        if self.dirty:
            return 1.0
        if self.sender is not None:
            return None  # its end wakes the loop
        if self.record.get("lines_batch"):
            return max(0.0, self.next_try - time.monotonic())
        if told_lines.pending(self.record):
            return max(0.0, self.every - self._since_told()) + 0.001
        return None

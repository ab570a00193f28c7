"""The calls in flight: each one's cancel switch and voice, the ids in flight
and those answered (for their late cancels), and the threads that run them.

A call runs on a thread of the session's own workers: a thread whose call is
done waits for the next one, so a call starts without waiting for a thread to
be made (bubblewrap's --die-with-parent is bound to the spawning thread, which
stays until the call's sandbox has ended).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .. import logger
from .protocol import Channel, RequestId

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..processes.runner import Cancel

Key = tuple[str, RequestId]
# progress(progress, total, message): what a call's context holds when its client asked for progress.
ProgressSender = Callable[[float, float | None, str | None], None]


class CallContext:
    """What the server knows of a call beyond its arguments: its _meta, its
    cancel switch, its progress sender when the client asked for one, and
    what the call leaves to do once its answer is out (run by the server then)."""

    __slots__ = ("meta", "cancel", "progress", "later")

    def __init__(self, meta: dict[str, object], cancel: Cancel, progress: ProgressSender | None = None) -> None:
        from ..processes.runner import Later  # loaded by the call's Cancel already

        self.meta, self.cancel, self.progress, self.later = meta, cancel, progress, Later()


# Answered ids remembered for their late cancel (opencode sends one about 50 ms
# after every answer): the most kept, so a client that never cancels costs little.
ANSWERED_KEPT = 1024
# An idle worker waits this long for a call before it ends; at most KEPT wait
# at once (a burst of calls leaves no crowd of threads behind).
IDLE = 60.0
KEPT = 4


def key_of(request_id: RequestId) -> Key:
    # 1 and "1" are different requests.
    return (type(request_id).__name__, request_id)


def progress_token(meta: dict[str, Any]) -> str | int | float | None:
    """A call's progress token, when it is one (a bool is not)."""
    token = meta.get("progressToken")
    if isinstance(token, bool) or not isinstance(token, (str, int, float)):
        return None
    return token


class Call:
    """A request in flight: its cancel switch and whether it may still speak."""

    def __init__(self, request_id: RequestId, progress_token: str | int | float | None) -> None:
        self.id = request_id
        self.key = key_of(request_id)
        from ..processes.runner import Cancel  # here: the handshake is answered before the runner loads

        self.cancel = Cancel()
        self.progress_token = progress_token
        self.progress: float | None = None  # the last sent: progress only rises
        self.done = False
        self.lock = threading.Lock()

    def may_answer(self) -> bool:
        """True once, for the answer, unless the call was silenced first."""
        with self.lock:
            if self.done:
                return False
            self.done = True
            return True

    def silence(self) -> None:
        """Killed now: no answer, no more progress."""
        with self.lock:
            self.done = True
        self.cancel.cancel()

    def progress_sender(self, channel: Channel, version: str) -> ProgressSender:
        def send(progress: float, total: float | None = None, message: str | None = None) -> None:
            params = {"progressToken": self.progress_token, "progress": progress}
            if total is not None:
                params["total"] = total
            if message is not None and version >= "2025-03-26":
                params["message"] = message
            with self.lock:  # under the call's lock, so none can follow its answer
                if self.done or (self.progress is not None and progress <= self.progress):
                    return
                self.progress = progress
                # An unwritten one of this call is replaced: a slow client gets the latest, not a backlog.
                channel.send({"jsonrpc": "2.0", "method": "notifications/progress", "params": params},
                             replaces=("progress", *self.key))
        return send


class InFlight:
    """The session's calls in flight, and the ids answered lately."""

    def __init__(self) -> None:
        self._calls: dict[Key, Call] = {}
        self._answered: OrderedDict[Key, None] = OrderedDict()  # each may draw one late cancel
        self._lock = threading.Lock()

    def add(self, call: Call, replace: bool = False) -> bool:
        """False when a call of that id is in flight already (unless `replace`)."""
        with self._lock:
            if call.key in self._calls and not replace:
                return False
            self._calls[call.key] = call
            return True

    def cancel(self, request_id: RequestId) -> None:
        """A client's cancel: the call it names is silenced, unless the id was
        answered already (that answer's late cancel touches nothing, even when
        a later call reuses the id)."""
        key = key_of(request_id)
        with self._lock:
            if key in self._answered:
                del self._answered[key]
                return
            call = self._calls.pop(key, None)
        if call is not None:
            call.silence()

    def forget(self, call: Call, answered: bool) -> None:
        """The call is no longer in flight; an answered one is remembered for its
        late cancel (before its answer goes out, so that the cancel finds it)."""
        with self._lock:
            if self._calls.get(call.key) is call:
                del self._calls[call.key]
            if answered:
                self._answered[call.key] = None
                if len(self._answered) > ANSWERED_KEPT:
                    self._answered.popitem(last=False)

    def silence_all(self) -> None:
        with self._lock:
            calls = list(self._calls.values())
        for call in calls:
            call.silence()


class Workers:
    """Threads that run jobs, each kept for the next one once its job is done.

    A job given with `run` is counted until it is done (`wait` waits for
    it); `count` counts one that some thread runs itself, and `start` gives a
    thread a job that is not counted (the reading of stdin, passed on)."""

    def __init__(self, idle: float = IDLE, kept: int = KEPT) -> None:
        self.idle_for = idle  # how long a worker waits for a job before it ends
        self.kept = kept  # the most workers waiting at once
        self._jobs: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._lock = threading.Condition()
        self._idle = 0  # workers waiting, less the jobs queued for them
        self._busy = 0  # jobs given and not yet done

    def run(self, job: Callable[[], object]) -> None:
        """Run `job` on an idle worker, or on a new one when none is idle."""
        self.start(self.count(job))

    def count(self, job: Callable[[], object]) -> Callable[[], None]:
        """`job` counted as given from now: what this returns runs it, then counts it done."""
        with self._lock:
            self._busy += 1

        def counted() -> None:
            try:
                job()
            finally:
                with self._lock:
                    self._busy -= 1
                    self._lock.notify_all()

        return counted

    def start(self, job: Callable[[], object]) -> None:
        """`job` on an idle worker, or on a new one when none is idle; not counted."""
        with self._lock:
            new = self._idle == 0
            if not new:
                self._idle -= 1
        self._jobs.put(job)
        if new:
            threading.Thread(target=self._work, daemon=True, name="call").start()

    def wait(self, deadline: float) -> None:
        """Until every job given is done, or the deadline (time.monotonic)."""
        with self._lock:
            self._lock.wait_for(lambda: self._busy == 0, max(0.0, deadline - time.monotonic()))

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.idle_for)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # no job is on its way to this worker
                        self._idle -= 1
                        return
                continue
            try:
                job()
            except BaseException as problem:  # a bug of ours: said, and the worker serves on
                logger.error(f"internal error in a call: {problem!r}")
            if not self._rest():
                return

    def _rest(self) -> bool:
        """A job is done: True when its worker waits for the next one."""
        with self._lock:
            if self._idle >= self.kept:
                return False  # enough wait already
            self._idle += 1
            return True

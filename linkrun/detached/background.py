"""`start`, `list`, `read` and `stop`: background commands, on their records.

serve never forks Python code (it has threads) and nothing a supervisor must
outlive runs here: `start` writes the record and has a detached supervisor
started, forked by serve's warm fork server (warm.py) or booted (steps 1 to
4 below; the supervisor's own steps are numbered in supervise.py), and the
other tools read records and output files.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .. import logger
from . import admission, outread
from .. import config
from ..sandboxing import beneath
from ..state import layout, records
from .input import on_terminal, terminal_size, waiting_for_input
from .outread import ReadChunk
from .warm import WarmForks
from .watch import Watcher
from ..config import Serve
from ..errors import LinkRunError, Refused
from ..kernel import write_all
from ..messages.conversation import conversation
from ..processes.runner import Request
from ..units import local_time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..state.records import Record

STOP_WAIT = 5.0
SETTLE_WAIT = 2.0  # seconds the end of a command whose supervisor is gone or ending may take to be written
PROGRESS_EVERY = 0.25  # a waiting read reports its progress at most this often
Entries = list[dict[str, Any]]  # commands as list and stop answer them (the class's own `list` hides the builtin)
UNKNOWN = "no command of this conversation's has id {id!r}; list shows this conversation's commands"


def background_settings(settings: Serve) -> config.BackgroundSettings:
    """The background commands' settings, which a serve offering them has."""
    if settings.background is None:
        raise LinkRunError("this serve offers no background commands", "give it --state to offer them")
    return settings.background


class Background:
    """The background tools of one serve: its settings and its one watcher."""

    def __init__(self, settings: Serve, files_fd_getter: Callable[[], int]) -> None:
        self.settings = settings
        self.b = background_settings(settings)
        self.state = self.b.state
        self.files_fd = files_fd_getter
        self.watcher = Watcher((self.state, os.path.join(settings.files, layout.BACKGROUND)))
        self.supervisor_argv: list[str] | None = None  # found at the first start
        self.ready = threading.Event()  # set after the session's first answer: the first sweep may run
        # The furthest byte of each command's output a read or a write answered with: a write answers from
        # there, so that what its program printed after the last answer (a prompt late to its file) is not skipped.
        self.answered: dict[str, int] = {}
        # Supervisors forked ready-imported; LNK_WARM_FORKS=0 boots each afresh (a fallback, and the baseline).
        warm = settings.programs and os.environ.get("LNK_WARM_FORKS") != "0"
        # Each supervisor forked ahead makes its sandbox ahead; LNK_SANDBOX_AHEAD=0 makes it at the start (the baseline).
        ahead = self.sandbox_fields() if os.environ.get("LNK_SANDBOX_AHEAD") != "0" else None
        self.warm = WarmForks(self.state, ahead) if warm else None

    def answered_to(self, command_id: str, reached: int) -> None:
        """A read's or a write's answer gave the command's output up to byte `reached`."""
        self.answered[command_id] = max(reached, self.answered.get(command_id, 0))

    def conversation(self, meta: dict[str, Any]) -> tuple[str, int]:
        return conversation(meta, self.b.way_in is not None)

    # -- start ----------------------------------------------------------------

    def start(self, request: Request, argv_tail: list[str], arguments: dict[str, Any], meta: dict[str, Any]) -> str:
        """The new command's id."""
        thread, hops = self.conversation(meta)
        terminal_size(arguments)  # refused now, before anything is made, when its size is not one
        if arguments.get("tell_on") is not None:
            from .lines import compile_pattern

            compile_pattern(arguments["tell_on"])  # refused now, saying why, if RE2 cannot take it
        if hops >= self.b.hops:
            raise Refused(f"this call is {hops} hops from a person, and start is allowed below {self.b.hops}",
                          "a command started by a told message may not start more: run it with command instead")
        background_fd = self.background_folder()
        os.close(background_fd)
        layout.ensure_state(self.state)
        with admission.start_lock(self.state):
            if os.path.exists(os.path.join(self.state, layout.REMOVED)):
                raise Refused("this agent is being removed", "no command can start any more")
            admission.check_caps(self.state, self.b.running, self.b.per_day)
            # 2. The lock first, so no sweep ever sees a new record with a free lock.
            while True:
                command_id = records.new_id()
                try:
                    lock_fd = records.create_lock(self.state, command_id)
                    break
                except FileExistsError:
                    continue
            try:
                record = self.new_record(command_id, request, argv_tail, arguments, thread, hops)
                # 3. The record, state starting, and its input.
                try:
                    records.write(self.state, command_id, record)
                    if request.input:
                        _write_new(layout.path(self.state, command_id, layout.INPUT), request.input)
                except OSError as problem:
                    self.forget(command_id)  # we still hold its lock: nothing of it stays
                    raise LinkRunError(f"cannot write the command's record in the state folder {self.state}: "
                                       f"{problem.strerror}", "free space on its disk; nothing was started") from None
                # Counted before the spawn: a serve killed between the two
                # must never leave a command running that the cap missed.
                counted = admission.count_start(self.state, record["started"])
                # 4. The supervisor, detached; its intermediate exits at once.
                code = self.spawn_supervisor(command_id, lock_fd)
            finally:
                os.close(lock_fd)
            if code != 0:
                admission.uncount_start(self.state, counted)
                record.update({"state": records.State.FAILED_TO_START, "ended": records.now(), "told": records.Told.TOLD})
                records.write(self.state, command_id, record)
                raise LinkRunError(f"the supervisor of {command_id} could not start (exit {code})",
                                   f"its log is {layout.path(self.state, command_id, layout.LOG)}")
        return command_id

    def forget(self, command_id: str) -> None:
        """A start cut short before its supervisor: its files, the lock last (the caller holds it)."""
        for suffix in (layout.RECORD, layout.INPUT, layout.LOG, layout.LOCK):
            try:
                os.unlink(layout.path(self.state, command_id, suffix))
            except FileNotFoundError:
                pass

    def background_folder(self, create: bool = True) -> int:
        """`background/` of the files folder: made with mkdirat, never a link."""
        files_fd = self.files_fd()
        if create:
            try:
                os.mkdir(layout.BACKGROUND, 0o755, dir_fd=files_fd)
            except FileExistsError:
                pass
        try:
            return beneath.open_folder(files_fd, layout.BACKGROUND)
        except beneath.NotBeneath as problem:
            raise Refused(f"the files folder's background/ {problem.why}",
                          "background commands need background/ to be a folder of the files folder; "
                          "remove what is there") from None

    def new_record(self, command_id: str, request: Request, argv_tail: list[str], arguments: dict[str, Any], thread: str,
                   hops: int) -> Record:
        s, b = self.settings, self.b
        tty = terminal_size(arguments)
        if tty is not None:
            argv_tail = on_terminal(argv_tail, tty)
        return records.new_record(
            command_id, **self.sandbox_fields(), folder=request.folder, program=arguments["program"],
            args=list(request.args), program_argv=argv_tail, output=s.output, background_output=b.output,
            keep=b.keep, way_in=b.way_in, agent=b.agent, keyring=b.keyring, thread=thread, hops=hops,
            tell_on=arguments.get("tell_on"), tty=tty)

    def sandbox_fields(self) -> dict[str, Any]:
        """The record's fields its sandbox is made from: the same for each
        command of this serve, which its warm fork server makes sandboxes ahead
        with (spareahead.FIELDS)."""
        s = self.settings
        return {"argv": list(s.sandbox), "write": list(s.write), "seccomp": s.seccomp, "files": s.files,
                "proxy": os.path.join(self.state, layout.PROXY_FOLDER) if s.proxy else None, "timeout": self.b.timeout,
                "limits": s.limits.as_record() if s.limits is not None else None}

    def spawn_supervisor(self, command_id: str, lock_fd: int) -> int:
        log = os.open(layout.path(self.state, command_id, layout.LOG),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            code = self.warm.spawn(command_id, lock_fd, log) if self.warm is not None else None
            if code is not None:
                return code
            if self.supervisor_argv is None:
                from .starter import script_argv

                self.supervisor_argv = script_argv("ID", "STATE")
            argv = [command_id if a == "ID" else self.state if a == "STATE" else a for a in self.supervisor_argv]
            intermediate = subprocess.Popen(
                argv,
                stdin=lock_fd, stdout=subprocess.DEVNULL, stderr=log,
                start_new_session=True, close_fds=True, cwd="/",
            )
        except OSError as problem:
            logger.warning(f"cannot start a supervisor: {problem}")
            return 127
        finally:
            os.close(log)
        return intermediate.wait()  # reaped on this thread: no zombie

    # -- sweeps ---------------------------------------------------------------------

    def start_sweeping(self) -> None:
        """A detached sweep now, then every minute while a record it saw is
        untold, else every ten minutes. Never waited for by a call."""
        def loop() -> None:
            # The first sweep waits for the session's first answer (or two
            # seconds): a start with many records must not slow `initialize`.
            self.ready.wait(2.0)
            if (problem := self.key_problem()) is not None:  # said now, not only once an end cannot be told
                logger.warning(f"{problem}: the ends of background commands cannot be told through the way in "
                               "until it is mended")
            if self.warm is not None:
                self.warm.start()  # so the first start finds it warm
            while True:
                self.run_sweep()
                untold = any((r := records.load(self.state, i)) and r.get("told") in records.TO_TELL
                             for i in records.ids(self.state))
                time.sleep(60 if untold else 600)

        threading.Thread(target=loop, daemon=True, name="sweeps").start()

    def key_problem(self) -> str | None:
        """What keeps the way in from being told, with its fix: the agent's key
        missing or unusable (read at serve's start and at each start); None
        when it is fine, or when nothing tells."""
        b = self.b
        if not b.way_in:
            return None
        from ..messages.wayin import read_key

        assert b.agent is not None and b.keyring is not None  # config gives both with every way in
        try:
            read_key(b.keyring, b.agent)
            return None
        except (LinkRunError, OSError) as problem:  # never the sweeps' end: they run whatever the key
            return (f"{problem.message}; {problem.hint}" if isinstance(problem, LinkRunError) else
                    f"the agent's key in {b.keyring} cannot be read ({problem}); check the disk")

    def run_sweep(self) -> None:
        if not os.path.isdir(self.state):
            return  # nothing started yet: nothing to mend
        argv = [sys.executable, "-I", "-m", "linkrun", "sweep", "--state", self.state]
        b = self.b
        if b.way_in:
            assert b.agent is not None and b.keyring is not None  # config gives both with every way in
            argv += ["--way-in", b.way_in, "--as", b.agent, "--keyring", b.keyring]
        try:
            sweeper = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       start_new_session=True, close_fds=True, cwd="/")
        except OSError as problem:
            logger.warning(f"cannot start a sweep: {problem}")
            return
        sweeper.wait()  # on this thread, so it is reaped; it outlives serve if serve exits first

    # -- list, read, stop -------------------------------------------------------

    def own_record(self, command_id: object, meta: dict[str, Any]) -> Record:
        thread, _ = self.conversation(meta)
        if not isinstance(command_id, str) or not records.ID.fullmatch(command_id):
            raise Refused(UNKNOWN.format(id=command_id))  # never touches the disk
        record = records.load(self.state, command_id)
        if record is None or record.get("thread") != thread:
            raise Refused(UNKNOWN.format(id=command_id))
        return record

    def running_of(self, meta: dict[str, Any]) -> list[str]:
        """The ids of this conversation's commands that run, by their records (none without a conversation)."""
        try:
            thread, _ = self.conversation(meta)
        except Refused:
            return []
        return [command_id for command_id in records.ids(self.state)
                if (record := records.load(self.state, command_id)) and record.get("thread") == thread
                and record["state"] in records.RUNNING_STATES]

    def list(self, meta: dict[str, Any]) -> Entries:
        """This conversation's commands, newest first, as entries."""
        thread, _ = self.conversation(meta)
        own = []
        for command_id in records.ids(self.state):
            record = records.load(self.state, command_id)
            if not record or record.get("thread") != thread:
                continue
            if record["state"] in records.RUNNING_STATES and not (records.is_held(self.state, command_id)
                                                                  and records.gate_alive(record)):
                # Its supervisor is gone or ending: say how it ended now rather than at the next sweep.
                try:
                    record = self.settled(command_id)
                except OSError as problem:  # a full state folder: the next sweep mends it
                    logger.warning(f"cannot sweep {command_id} now: {problem}")
                except Refused:
                    continue  # removed meanwhile
            own.append(record)
        own.sort(key=lambda r: r["started"], reverse=True)
        return self.entries(own)

    def entries(self, own: Sequence[Record]) -> Entries:
        """The records as list shows them; background/ opened once, for the running ones' output."""
        folder = self._folder_for_totals(own)
        try:
            return [self.entry(record, folder) for record in own]
        finally:
            if folder is not None:
                os.close(folder)

    def _folder_for_totals(self, own: Sequence[Record]) -> int | None:
        """background/, open, when a running command's bytes so far are wanted; else None, as when it
        cannot be opened (the records' own totals are shown then)."""
        if not any(record["state"] in records.RUNNING_STATES for record in own):
            return None
        try:
            return self.background_folder(create=False)
        except (LinkRunError, OSError):
            return None

    def entry(self, record: Record, folder: int | None) -> dict[str, Any]:
        """`folder`: background/, open, for a running command's bytes so far (None: as its record last said)."""
        ended = record.get("ended") or records.now()
        total, unreadable = record.get("bytes") or 0, None
        if record["state"] in records.RUNNING_STATES and folder is not None:
            try:
                total = outread.output_total(folder, self.state, record["id"]) or total
            except Refused as refused:  # a link planted on the host: this entry says so, not the whole list
                unreadable = refused.message
            except (OSError, outread.Removed):
                pass
        entry = {
            "id": record["id"], "program": record["program"], "args": record["args"],
            "folder": record["folder"] or ".", "state": record["state"], "exit": record.get("exit"),
            "signal": record.get("signal"), "seconds": round(max(0.0, ended - record["started"]), 3),
            "bytes": total, "started": local_time(record["started"]), "told": record["told"],
            "limit": record.get("limit"),
        }
        if unreadable is not None:
            entry["unreadable"] = unreadable
        entry["waiting"] = waiting_for_input(self.state, record)
        return entry

    def read(self, arguments: dict[str, Any], meta: dict[str, Any], wait: float,
             progress: Callable[[float, float], None] | None = None) -> ReadChunk:
        """Its output from `offset`, waiting up to `wait` seconds (checked by the read tool) for more."""
        command_id = arguments.get("id")
        record = self.own_record(command_id, meta)
        offset = arguments.get("offset")
        if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int) or offset < 0):
            raise Refused("offset must be a whole number of bytes, 0 or more", "use the next of the last read")
        deadline = time.monotonic() + wait
        reported: float | None = None
        with self.watcher.watching(wait > 0), self.output_folder() as folder:
            while True:
                seen = self.watcher.changes(record["id"])
                chunk = self.read_once(folder, record["id"], offset)
                now = time.monotonic()
                if chunk.data or chunk.ended or now >= deadline:
                    break
                waited = round(wait - (deadline - now), 1)
                if progress is not None and (reported is None or waited >= reported + PROGRESS_EVERY):
                    progress(waited, wait)
                    reported = waited
                self.watcher.wait_change(record["id"], seen, min(1.0, deadline - now))
        return chunk

    def read_once(self, folder: int, command_id: str, offset: int | None) -> ReadChunk:
        try:
            return outread.read_once(folder, self.state, command_id, offset, self.settings.output)
        except outread.Removed:
            raise Refused(UNKNOWN.format(id=command_id)) from None

    @contextlib.contextmanager
    def output_folder(self) -> Iterator[int]:
        """`background/`, open, for one call's reads of output files."""
        folder = self.background_folder(create=False)
        try:
            yield folder
        finally:
            os.close(folder)

    def stop(self, arguments: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
        record = self.own_record(arguments.get("id"), meta)
        command_id: str = record["id"]  # the id asked for: load checks it
        if record["state"] in records.RUNNING_STATES:
            if not records.is_held(self.state, command_id):
                record = self.settled(command_id)  # swept here: no supervisor to stop
            else:
                records.write_stop(self.state, command_id, "stopped")
                record = self.record_until(command_id, STOP_WAIT, ended)
        return self.entries([record])[0]

    def settled(self, command_id: str) -> Record:
        """The record of a command whose supervisor is gone or ending, once it
        says how the command ended: swept here when no one holds its lock;
        else waited for, since the lock's holder (its supervisor ending, or a
        sweep of a lost one) writes the end. At most SETTLE_WAIT seconds: then as it stands."""

        def sweep_if_free() -> None:
            if not records.is_held(self.state, command_id):
                self.sweep_one(command_id)

        return self.record_until(command_id, SETTLE_WAIT, ended, before=sweep_if_free)

    def record_until(self, command_id: str, seconds: float, done: Callable[[Record], bool],
                     before: Callable[[], None] = lambda: None) -> Record:
        """The record, loaded again at each change the watcher hears, until `done` says so or
        `seconds` pass (then as it stands); `before` runs ahead of each load."""
        deadline = time.monotonic() + seconds
        with self.watcher.watching(True):
            while True:
                seen = self.watcher.changes(command_id)
                before()
                record = self.reload(command_id)
                if done(record) or time.monotonic() >= deadline:
                    return record
                self.watcher.wait_change(command_id, seen, max(0.0, min(0.5, deadline - time.monotonic())))

    def reload(self, command_id: str) -> Record:
        """The record again: one gone meanwhile (removed, or set aside as bad) is no command any more."""
        record = records.load(self.state, command_id)
        if record is None:
            raise Refused(UNKNOWN.format(id=command_id))
        return record

    def sweep_one(self, command_id: str) -> None:
        from . import sweep  # only here: it loads the telling

        sweep.sweep_record(self.state, command_id)


def ended(record: Record) -> bool:
    return record["state"] not in records.RUNNING_STATES


def _write_new(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)

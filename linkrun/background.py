"""`start`, `list`, `read` and `stop`: background commands, on their records.

serve never forks Python code (it has threads) and nothing a supervisor must
outlive runs here: `start` writes the record and execs a detached
supervisor (steps 1 to 4 below; the supervisor's own steps are numbered in
supervise.py), and the other tools read records and output files.
"""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, UTC

from . import beneath, records
from .capture import utf8_head, utf8_tail
from .config import Serve, format_duration
from .errors import LinkRunError, Refused
from .tools import nullable

THREAD_KEY = "link.local/thread"
HOPS_KEY = "link.local/hops"
START_LOCK_WAIT = 5.0
DAY = 86400
MAX_WAIT = 30
STOP_WAIT = 5.0
UNKNOWN = "no command of this conversation's has id {id!r}; list shows this conversation's commands"

_ID = {"type": "string", "description": "The command's id, as start answered it."}
_ENTRY = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "program": {"type": "string"},
        "args": {"type": "array", "items": {"type": "string"}},
        "folder": {"type": "string"},
        "state": {"type": "string", "enum": ["starting", "running", "exited", "stopped", "timed out", "lost", "failed to start"]},
        "exit": nullable("integer"),
        "signal": nullable("string"),
        "seconds": {"type": "number"},
        "bytes": {"type": "integer"},
        "started": {"type": "string"},
        "told": {"type": "string", "enum": ["untold", "telling", "told", "given up", "no way in"]},
        "limit": nullable("string", 'The limit that bit: "memory" (its out-of-memory killer killed), '
                          '"tasks" (a fork was refused at its task limit), or null.'),
    },
    "required": ["id", "program", "args", "folder", "state", "exit", "signal", "seconds", "bytes", "started", "told",
                 "limit"],
}


def tool_table(run_properties: dict, settings: Serve) -> dict[str, dict]:
    b = settings.background
    no_way_in = b.way_in is None
    told = ("use list, and read with wait, to learn how it ended" if no_way_in
            else "a message from run:<id> tells this conversation how it ended")
    hints = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": settings.proxy}
    read_only = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}
    return {
        "start": {
            "name": "start", "title": "Start a background command",
            "description": (f"Start a program as command would, in the background, and answer at once with its id; "
                            f"it runs for at most {format_duration(b.timeout)}, and {told}. Its output, both "
                            "streams as one, goes to background/<id>.out in the files folder."),
            "inputSchema": {"type": "object", "properties": run_properties, "required": ["program"],
                            "additionalProperties": False},
            "outputSchema": {"type": "object", "properties": {"id": {"type": "string"}, "output": {"type": "string"}},
                             "required": ["id", "output"]},
            "annotations": {"title": "Start a background command", **hints},
        },
        "list": {
            "name": "list", "title": "List background commands",
            "description": "Each background command this conversation started, running or ended, newest first.",
            "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
            "outputSchema": {"type": "object", "properties": {"commands": {"type": "array", "items": _ENTRY}},
                             "required": ["commands"]},
            "annotations": {"title": "List background commands", **read_only},
        },
        "read": {
            "name": "read", "title": "Read a background command's output",
            "description": ("A background command's output from byte `offset` (go on from the answer's `next`), or "
                            "without offset its last bytes; `wait` (seconds, at most 30) waits for more output "
                            "or its end."),
            "inputSchema": {"type": "object", "properties": {
                "id": _ID,
                "offset": {"type": "integer", "minimum": 0, "description": "The byte to read from, counted from its first byte."},
                "wait": {"type": "number", "minimum": 0, "maximum": MAX_WAIT,
                         "description": "Seconds to wait when there is nothing new yet (at most 30)."},
            }, "required": ["id"], "additionalProperties": False},
            "outputSchema": {"type": "object", "properties": {
                "id": {"type": "string"}, "state": {"type": "string"}, "offset": {"type": "integer"},
                "next": {"type": "integer"}, "kept_from": {"type": "integer"}, "total": {"type": "integer"},
                "text": {"type": "string", "description": "The returned bytes (offset to next), decoded."},
            }, "required": ["id", "state", "offset", "next", "kept_from", "total", "text"]},
            "annotations": {"title": "Read a background command's output", **read_only},
        },
        "stop": {
            "name": "stop", "title": "Stop a background command",
            "description": "Stop a background command with everything it started, and answer how it ended.",
            "inputSchema": {"type": "object", "properties": {"id": _ID}, "required": ["id"], "additionalProperties": False},
            "outputSchema": _ENTRY,
            "annotations": {"title": "Stop a background command", "readOnlyHint": False, "destructiveHint": True,
                            "idempotentHint": True, "openWorldHint": False},
        },
    }


def conversation(meta: dict, need_hops: bool = False) -> tuple[str, int]:
    thread = meta.get(THREAD_KEY)
    if not isinstance(thread, str) or not thread:
        raise Refused("background commands need the conversation",
                      f'the call\'s _meta must carry "{THREAD_KEY}" (a non-empty string); a harness that takes '
                      "messages sets it")
    hops = meta.get(HOPS_KEY, 0)
    if isinstance(hops, bool) or not isinstance(hops, int) or hops < 0:
        raise Refused(f'_meta "{HOPS_KEY}" must be a whole number of 0 or more', "leave it out for 0")
    return thread, hops


class Background:
    """The background tools of one serve: its settings and its one watcher."""

    def __init__(self, settings: Serve, files_fd_getter):
        self.settings = settings
        self.b = settings.background
        self.state = self.b.state
        self.files_fd = files_fd_getter
        self.watcher = Watcher(self)
        self.supervisor_argv = None  # found at the first start

    # -- start ----------------------------------------------------------------

    def start(self, request, argv_tail: list[str], arguments: dict, meta: dict) -> dict:
        thread, hops = conversation(meta)
        if hops >= self.b.hops:
            raise Refused(f"this call is {hops} hops from a person, and start is allowed below {self.b.hops}",
                          "a command started by a told message may not start more: run it with command instead")
        background_fd = self.background_folder()
        os.close(background_fd)
        records.ensure_state(self.state)
        with self.start_lock():
            if os.path.exists(os.path.join(self.state, "removed")):
                raise Refused("this agent is being removed", "no command can start any more")
            self.check_caps()
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
                records.write(self.state, command_id, record)
                if request.input:
                    _write_new(records.path(self.state, command_id, ".in"), request.input)
                # 4. The supervisor, detached; its intermediate exits at once.
                code = self.spawn_supervisor(command_id, lock_fd)
            finally:
                os.close(lock_fd)
            if code != 0:
                record.update(state="failed to start", ended=records.now(), told="told")
                records.write(self.state, command_id, record)
                raise LinkRunError(f"the supervisor of {command_id} could not start (exit {code})",
                                   f"its log is {records.path(self.state, command_id, '.log')}")
            self.count_start(record["started"])
        return {"id": command_id, "output": f"background/{command_id}.out"}

    def background_folder(self, create: bool = True) -> int:
        """`background/` of the files folder: made with mkdirat, never a link."""
        files_fd = self.files_fd()
        if create:
            try:
                os.mkdir("background", 0o755, dir_fd=files_fd)
            except FileExistsError:
                pass
        try:
            return beneath.open_folder(files_fd, "background")
        except beneath.NotBeneath as problem:
            raise Refused(f"the files folder's background/ {problem.why}",
                          "background commands need background/ to be a folder of the files folder; "
                          "remove what is there") from None

    def start_lock(self):
        path = os.path.join(self.state, "start.lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + START_LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
                    os.close(fd)
                    raise Refused(f"the state folder's start lock is held by process {holder} for over "
                                  f"{START_LOCK_WAIT:.0f} s", "try again; if it stays, that process is stuck") from None
                time.sleep(0.01)  # flock has no timed wait: retry without blocking
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return _Held(fd)

    def check_caps(self):
        """1. What runs against --background, the day's starts against --background-per-day."""
        running = 0
        for command_id in records.ids(self.state):
            record = records.load(self.state, command_id)
            if record and record.get("state") in records.RUNNING_STATES and records.is_held(self.state, command_id):
                running += 1
        if running >= self.b.running:
            raise Refused(f"{running} background commands run already, the most at once",
                          "a place frees up when one ends: wait for one, or stop one (list shows them)")
        now = records.now()
        starts = self.starts_since(now - DAY)
        if len(starts) >= self.b.per_day:
            frees = datetime.fromtimestamp(min(starts) + DAY).astimezone().isoformat(timespec="seconds")
            raise Refused(f"{len(starts)} background commands started in the last 24 hours, the most in a day",
                          f"a place frees up at {frees}")

    def count_start(self, when: float):
        """Append a start to `starts` (under start.lock); now and then drop
        the lines older than a day, so the file stays small."""
        path = os.path.join(self.state, "starts")
        with open(path, "a") as f:
            f.write(f"{when:.3f}\n")
            size = f.tell()
        if size > 64 * 1024:
            recent = self.starts_since(records.now() - DAY)
            temporary = path + ".new"
            with open(temporary, "w") as f:
                f.writelines(f"{t:.3f}\n" for t in recent)
            os.replace(temporary, path)

    def starts_since(self, since: float) -> list[float]:
        now = records.now()
        try:
            with open(os.path.join(self.state, "starts")) as f:
                times = [min(float(line), now) for line in f if line.strip()]  # the future counts as now
        except FileNotFoundError:
            return []
        except ValueError:
            times = []
        return [t for t in times if t > since]

    def new_record(self, command_id, request, argv_tail, arguments, thread, hops) -> dict:
        s, b = self.settings, self.b
        return {
            "v": records.VERSION, "id": command_id, "argv": list(s.sandbox), "write": list(s.write),
            "proxy": os.path.join(self.state, "proxy") if s.proxy else None, "seccomp": s.seccomp,
            "files": s.files, "folder": request.folder, "program": arguments["program"],
            "args": list(request.args), "program_argv": argv_tail, "started": records.now(),
            "timeout": b.timeout, "output": s.output, "background_output": b.output, "keep": b.keep,
            "way_in": b.way_in, "as": b.agent, "keyring": b.keyring, "thread": thread, "hops": hops,
            "state": "starting", "group": None, "leader_pid": None, "leader_start": None, "boot_id": None,
            "init_pid": None, "init_start": None,
            "limits": s.limits.as_record() if s.limits is not None else None, "cgroup": None, "limit": None,
            "inode": None, "kept_from": 0, "bytes": 0, "ended": None, "exit": None, "signal": None,
            "told": "no way in" if b.way_in is None else "untold",
            "first_try": None, "sweep_first_try": None, "told_at": None,
        }

    def spawn_supervisor(self, command_id: str, lock_fd: int) -> int:
        log = os.open(records.path(self.state, command_id, ".log"),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            if self.supervisor_argv is None:
                from .supervise import script_argv

                self.supervisor_argv = script_argv("ID", "STATE")
            argv = [command_id if a == "ID" else self.state if a == "STATE" else a for a in self.supervisor_argv]
            intermediate = subprocess.Popen(
                argv,
                stdin=lock_fd, stdout=subprocess.DEVNULL, stderr=log,
                start_new_session=True, close_fds=True, cwd="/",
            )
        except OSError as problem:
            print(f"lnk-link-run serve: cannot start a supervisor: {problem}", file=sys.stderr)
            return 127
        finally:
            os.close(log)
        return intermediate.wait()  # reaped on this thread: no zombie

    # -- sweeps ---------------------------------------------------------------------

    def start_sweeping(self):
        """A detached sweep now, then every minute while a record it saw is
        untold, else every ten minutes. Never waited for by a call."""
        def loop():
            # The first sweep waits for the session's first answer (or two
            # seconds): a start with many records must not slow `initialize`.
            self.ready.wait(2.0)
            while True:
                self.run_sweep()
                untold = any((r := records.load(self.state, i)) and r.get("told") in ("untold", "telling")
                             for i in records.ids(self.state))
                self.sweep_now.wait(60 if untold else 600)
                self.sweep_now.clear()

        self.sweep_now = threading.Event()
        self.ready = threading.Event()
        threading.Thread(target=loop, daemon=True, name="sweeps").start()

    def run_sweep(self):
        if not os.path.isdir(self.state):
            return  # nothing started yet: nothing to mend
        argv = [sys.executable, "-I", "-m", "linkrun", "sweep", "--state", self.state]
        if self.b.way_in:
            argv += ["--way-in", self.b.way_in, "--as", self.b.agent, "--keyring", self.b.keyring]
        try:
            sweeper = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       start_new_session=True, close_fds=True, cwd="/")
        except OSError as problem:
            print(f"lnk-link-run serve: cannot start a sweep: {problem}", file=sys.stderr)
            return
        sweeper.wait()  # on this thread, so it is reaped; it outlives serve if serve exits first

    # -- list, read, stop -------------------------------------------------------

    def own_record(self, command_id, meta: dict) -> dict:
        thread, _ = conversation(meta)
        if not isinstance(command_id, str) or not records.ID.match(command_id):
            raise Refused(UNKNOWN.format(id=command_id))  # never touches the disk
        record = records.load(self.state, command_id)
        if record is None or record.get("thread") != thread:
            raise Refused(UNKNOWN.format(id=command_id))
        return record

    def list(self, meta: dict) -> dict:
        thread, _ = conversation(meta)
        own = []
        for command_id in records.ids(self.state):
            record = records.load(self.state, command_id)
            if not record or record.get("thread") != thread:
                continue
            if record["state"] in records.RUNNING_STATES and not records.is_held(self.state, command_id):
                # Its supervisor is gone: say so now rather than at the next sweep.
                self.sweep_one(command_id)
                record = records.load(self.state, command_id) or record
            own.append(record)
        own.sort(key=lambda r: r["started"], reverse=True)
        return {"commands": [self.entry(r) for r in own]}

    def entry(self, record: dict) -> dict:
        running = record["state"] in records.RUNNING_STATES
        ended = record.get("ended") or records.now()
        total = record.get("bytes") or 0
        if running:
            total = self.output_total(record) or total
        return {
            "id": record["id"], "program": record["program"], "args": record["args"],
            "folder": record["folder"] or ".", "state": record["state"], "exit": record.get("exit"),
            "signal": record.get("signal"), "seconds": round(max(0.0, ended - record["started"]), 3),
            "bytes": total, "started": iso(record["started"]), "told": record["told"],
            "limit": record.get("limit"),
        }

    def output_total(self, record: dict) -> int | None:
        try:
            size = os.stat(f"{record['files']}/background/{record['id']}.out", follow_symlinks=False).st_size
        except OSError:
            return None
        return (record.get("kept_from") or 0) + size

    def read(self, arguments: dict, meta: dict, progress=None) -> tuple[dict, str]:
        command_id = arguments.get("id")
        record = self.own_record(command_id, meta)
        offset = arguments.get("offset")
        if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int) or offset < 0):
            raise Refused("offset must be a whole number of bytes, 0 or more", "use the next of the last read")
        wait = arguments.get("wait", 0)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= MAX_WAIT:
            raise Refused(f"wait must be a number of seconds from 0 to {MAX_WAIT}")
        deadline = time.monotonic() + wait
        with self.watcher.watching(wait > 0):
            while True:
                generation = self.watcher.generation
                chunk = self.read_once(record["id"], offset)
                if chunk["bytes"] or chunk["ended"] or time.monotonic() >= deadline:
                    break
                if progress is not None:
                    progress(round(wait - (deadline - time.monotonic()), 1), wait)
                self.watcher.wait_change(generation, min(1.0, deadline - time.monotonic()))
        return self.read_answer(chunk, offset)

    def read_once(self, command_id: str, offset: int | None) -> dict:
        """One consistent look at the output file and its record."""
        background_fd = self.background_folder(create=False)
        try:
            for _ in range(20):
                try:
                    fd = os.open(f"{command_id}.out", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=background_fd)
                except FileNotFoundError:
                    fd = None
                except OSError as error:
                    if error.errno == errno.ELOOP:
                        raise Refused(f"background/{command_id}.out is a link, which is never followed",
                                      "the output is not readable") from None
                    raise
                record = records.load(self.state, command_id)
                if fd is None:
                    if record["state"] in records.RUNNING_STATES and record.get("inode") is not None:
                        continue  # between a rotation's rename steps: look again
                    return {"record": record, "bytes": b"", "offset": 0, "kept_from": 0, "total": 0,
                            "ended": record["state"] not in records.RUNNING_STATES}
                info = os.fstat(fd)
                if record.get("inode") not in (None, info.st_ino):
                    os.close(fd)  # rotated since: the record is about another file
                    time.sleep(0.002)
                    continue
                try:
                    return self.read_at(fd, info.st_size, record, offset)
                finally:
                    os.close(fd)
            raise LinkRunError(f"the output of {command_id} kept changing under the read", "read again")
        finally:
            os.close(background_fd)

    def read_at(self, fd: int, size: int, record: dict, offset: int | None) -> dict:
        kept_from = record.get("kept_from") or 0
        total = kept_from + size
        limit = self.settings.output
        ended = record["state"] not in records.RUNNING_STATES
        if offset is None:
            start = max(kept_from, total - limit)
        else:
            start = min(max(offset, kept_from), total)
        data = os.pread(fd, min(limit, total - start), start - kept_from) if start < total else b""
        if start > kept_from or offset is None or offset < kept_from:
            trimmed = utf8_tail(data)  # never start inside a character
            start += len(data) - len(trimmed)
            data = trimmed
        if start + len(data) < total or not ended:
            data = utf8_head(data)  # a character still being written waits for the next read
        return {"record": record, "bytes": data, "offset": start, "kept_from": kept_from, "total": total,
                "ended": ended}

    def read_answer(self, chunk: dict, asked: int | None) -> tuple[dict, str]:
        record = chunk["record"]
        start, data = chunk["offset"], chunk["bytes"]
        text = data.decode("utf-8", errors="replace")
        # The text again: structured-first clients give the model this value alone.
        structured = {"id": record["id"], "state": record["state"], "offset": start, "next": start + len(data),
                      "kept_from": chunk["kept_from"], "total": chunk["total"], "text": text}
        lines = [f"{record['id']} · {record['state']} · bytes {start}–{start + len(data)} of {chunk['total']}"]
        if asked is not None and asked < chunk["kept_from"]:
            lines.append(f"[… bytes {asked}–{chunk['kept_from']} were dropped: only the last "
                         f"{self.b.output} bytes are kept …]")
        if data:
            lines.append(text)
        elif chunk["ended"]:
            lines.append("(no more output: it has ended)")
        else:
            lines.append("(nothing new yet: read again with wait)")
        if record.get("proxy") and record.get("leader_pid"):
            from .internet import refused, refused_note

            hosts = refused(self.state, record["started"], record["leader_pid"])
            if hosts:
                lines.append(refused_note(hosts, self.state))
        return structured, "\n".join(lines)

    def stop(self, arguments: dict, meta: dict) -> dict:
        command_id = arguments.get("id")
        record = self.own_record(command_id, meta)
        if record["state"] in records.RUNNING_STATES:
            if not records.is_held(self.state, command_id):
                self.sweep_one(command_id)
            else:
                records.write_stop(self.state, command_id, "stopped")
                deadline = time.monotonic() + STOP_WAIT
                with self.watcher.watching(True):
                    while True:
                        generation = self.watcher.generation
                        record = records.load(self.state, command_id)
                        if record["state"] not in records.RUNNING_STATES or time.monotonic() >= deadline:
                            break
                        self.watcher.wait_change(generation, min(0.5, deadline - time.monotonic()))
            record = records.load(self.state, command_id)
        return self.entry(record)

    def sweep_one(self, command_id: str):
        try:
            from . import sweep
        except ImportError:
            return
        sweep.sweep_record(self.state, command_id)


class _Held:
    def __init__(self, fd):
        self.fd = fd

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # releases the flock


def _write_new(path: str, data: bytes):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).astimezone().isoformat(timespec="seconds")


class Watcher:
    """serve's one watch of the state folder and background/, for every read
    and stop that waits. It runs only while someone waits: an idle server
    uses no CPU."""

    def __init__(self, background: Background):
        self.background = background
        self.condition = threading.Condition()
        self.generation = 0
        self.waiters = 0
        self.observer = None

    def watching(self, wanted: bool):
        watcher = self

        class Scope:
            def __enter__(self):
                if wanted:
                    watcher._join()

            def __exit__(self, *exc):
                if wanted:
                    watcher._leave()

        return Scope()

    def _join(self):
        with self.condition:
            self.waiters += 1
            if self.observer is None:
                self.observer = self._start()

    def _leave(self):
        with self.condition:
            self.waiters -= 1
            observer = self.observer if self.waiters == 0 else None
            if observer is not None:
                self.observer = None
        if observer:
            observer.stop()

    def _start(self):
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:
            return None
        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event):
                with watcher.condition:
                    watcher.generation += 1
                    watcher.condition.notify_all()

        observer = Observer()
        observer.daemon = True
        try:
            observer.schedule(Handler(), self.background.state, recursive=False)
            observer.schedule(Handler(), os.path.join(self.background.settings.files, "background"), recursive=False)
            observer.start()
        except OSError as problem:  # inotify exhausted: the waits fall back to their slices
            print(f"lnk-link-run serve: cannot watch for output ({problem}); reads that wait check "
                  "every second", file=sys.stderr)
            return None
        return observer

    def wait_change(self, generation: int, timeout: float):
        with self.condition:
            self.condition.wait_for(lambda: self.generation != generation, max(0.0, timeout))

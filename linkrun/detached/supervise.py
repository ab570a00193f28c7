"""The supervisor of one background command: its whole life, steps 1 to 9.

`start` (in serve, background.py) hands the command to the supervisor
serve's warm fork server (warm.py) forked ahead, ready-imported, or, when it
has none ready, runs `starter.script_argv` in a new session with the
record's lock as stdin: a shell that starts `python -I -S boot.py <folders>
supervise <id> --state <state>` in the background and exits at once (serve
reaps it). Either way the supervisor is in a session of its own and not
serve's child. It holds the lock until it exits; the kernel releases it
however it dies, which is how a sweep knows it is gone. `lnk-link-run
supervise` (`main`) is the design's own entry: it forks first, to the same
end, and runs the same `supervise`.

One forked ahead makes what is its alone (steps 1 and 3: its gate waits for
`G`) while serve answers, and then waits for the server's go before anything
it does is seen in the state or files folders (step 2's output file, the
input's port, step 4's record): without a go it lets its gate go and exits.

The step numbers are those of the design, and of background.py and gate.py.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable

from .. import logger
from ..state import layout, records
from ..state.records import AGENT_STOPPING, State, Told
from ..processes.child import boottime, kill_group, program_session, terminal_session
from ..units import signal_name
from ..errors import LinkRunError
from ..processes.group import Leader, Stage, Watch
from .gate import Ahead, Gate, make_gate
from .outfile import OutputFile
from .outread import last_bytes
from .input import InputPort

WATCH_PENDING = 0.01
TERM_GRACE = 2.0  # from the SIGTERM of a stop to the SIGKILL
FULL_RETRY_FIRST, FULL_RETRY_MOST = 0.05, 2.0  # seconds between tries to write a record on a full disk
USAGE = "usage: lnk-link-run supervise <id> --state <dir> (started by serve, not by hand)"

TYPE_CHECKING = False
if TYPE_CHECKING:  # watchdog is loaded only by the watch thread (step 2)
    from ..state.records import Record, Rotated, StateName
    from .spareahead import MadeAhead
    from watchdog.observers.api import BaseObserver
    from .tellon import LineTeller


def main(argv: list[str]) -> int:
    """`lnk-link-run supervise <id> --state <dir>`, the design's entry: fork (for its starter to reap), then supervise."""
    if len(argv) != 3 or argv[1] != "--state":
        print(USAGE, file=sys.stderr)
        return 2
    if os.fork():
        os._exit(0)  # the intermediate: serve reaps it at once
    return supervise(argv[0], argv[2])


def supervise(command_id: str, state: str, how: str = "booted", go: Callable[[], bool] | None = None,
              ahead: Ahead | None = None, made: MadeAhead | None = None) -> int:
    logger.start(f"supervise {command_id}")  # its stderr is its own log: never quiet
    if not records.ID.fullmatch(command_id):
        logger.error(f"{command_id!r} is not a command id")
        return 2
    return Supervisor(command_id, os.path.abspath(state)).run(how, go, ahead, made)


class Supervisor:
    def __init__(self, command_id: str, state: str) -> None:
        self.id = command_id
        self.state = state
        self.stop_path = layout.path(state, command_id, layout.STOP)
        self.stopped_for: StateName | None = None  # the stop file's reason, once read
        self.record: Record  # step 1 loads it
        self.lock_fd = -1
        # The wake pipe: signals (through set_wakeup_fd) and the stop file's watch write to it.
        self.wake_r = self.wake_w = -1
        self.signalled: int | None = None
        self.observer: BaseObserver | None = None  # the stop file's watchdog observer, once set
        self.poll_every: float | None = WATCH_PENDING  # how often to look for the stop file, if at all
        self.watching = threading.Thread(target=self.watch_stop, name="watch", daemon=True)
        self.output: OutputFile | None = None  # step 2 makes it; the end records what it holds
        self.teller: LineTeller | None = None  # with a tell_on pattern: its lines told as they come
        self.port: InputPort | None = None  # its input's port: writes reach it there (step 3 makes it)

    def run(self, how: str, go: Callable[[], bool] | None, ahead: Ahead | None = None,
            made_ahead: MadeAhead | None = None) -> int:
        """The steps; with `go` (a supervisor forked ahead), what is ours alone
        first, then nothing in the state or files folders before it says yes."""
        record, made = self.ours_alone(ahead, made_ahead)
        if go is not None and not go():
            if isinstance(made, Gate):
                self.let_nothing_run(made)
            return 0  # serve never heard of us: nothing of the command is ours
        logger.info(how + (", in its sandbox made ahead" if isinstance(made, Gate) and made.ahead else ""))
        if record is None:
            logger.error("no record: nothing to supervise")
            return 1
        return self.run_program(record, made)

    def ours_alone(self, ahead: Ahead | None, made_ahead: MadeAhead | None) -> tuple[Record | None, Gate | Exception | None]:
        """Steps 1 and 3 (before 2): the lock, the record read, the signals
        caught, and the gate (its sandbox prepared, its cgroup made, its
        input's pipe), from this (main) thread, whose death signal it follows.
        It waits for `G`, and nothing of it is in the state or files folders:
        a supervisor that gets no go lets it go, and leaves nothing. The gate,
        or the problem that kept it from being made. The sandbox made ahead
        or the gate forked ahead, if any, becomes it."""
        # 1. The lock, out of reach of what we run: fd 0 becomes /dev/null and
        # the lock moves to a close-on-exec descriptor. We never exec after this.
        self.lock_fd = os.dup(0)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.close(null)
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours already: a check, not a wait
        record = records.load(self.state, self.id)

        # The signals of the agent's service stopping are recorded and acted on by the loop (8).
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

        def on_signal(number: int, frame: object) -> None:
            self.signalled = number

        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(number, on_signal)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)

        made: Gate | Exception | None = None
        if record is None:
            if ahead is not None:
                ahead.close()
            if made_ahead is not None:
                made_ahead.end()
        else:
            self.record = record
            try:  # closes what it made when it fails
                taken = made_ahead.taken(record, self.state, self.id) if made_ahead is not None else None
                made, self.port = taken or make_gate(record, self.state, self.id, ahead)
            except Exception as problem:  # OSError, or a link planted on its folders since start
                made = problem
        return record, made

    def run_program(self, record: Record, made: Gate | Exception | None) -> int:
        """Step 2, the rest of 3, then 4 to 9: the output file, the input's
        port, the record naming the group, `G`, and the loop until the end."""
        # 2. Watch for the stop file, on a thread of its own started once the
        # program runs: importing watchdog takes longer than everything else
        # here, and the program need not wait for it. Until the watch is set,
        # the loop looks for the stop file every WATCH_PENDING seconds; once
        # it is set the loop looks once more, so no stop is ever lost (and
        # step 4 looks before `G`).
        try:
            output = self.output = OutputFile.create(record["files"], self.id, record["background_output"],
                                                     on_rotate=self.rotated, log=logger.info)
        except OSError as problem:
            logger.warning(f"cannot create the output file: {problem}")
            return self.nothing_ran(made, State.FAILED_TO_START)

        if os.path.exists(self.stop_path):
            return self.nothing_ran(made, self.stop_state())

        if record["proxy"]:
            # Among the proxy's users until we exit, so the command's internet
            # outlives the serve that started it. Without it the program still
            # runs, without the internet (the log says why).
            from ..network.internet import Users

            try:
                Users(self.state).ensure()
            except (LinkRunError, OSError) as problem:
                logger.warning(f"no internet for this command: {problem}")

        if not isinstance(made, Gate):
            logger.warning(f"nothing ran: {made}")
            return self.finish(State.FAILED_TO_START, None, None)
        gate = made
        try:
            self.open_input()
        except OSError as problem:
            logger.warning(f"nothing ran: cannot open the command's input: {problem}")
            return self.nothing_ran(gate, State.FAILED_TO_START)

        began = self.go(record, gate, output)
        if isinstance(began, str):
            return self.nothing_ran(gate, began)
        self.watching.start()  # only now: its imports would compete with the steps above
        try:
            return self.loop(gate, output, began)
        except Exception:
            # A failure of ours must not leave the command running unwatched.
            import traceback  # only here: it costs a start what it never needs

            logger.error("failed while it ran; killing its group:\n" + traceback.format_exc())
            gate.leader.kill()  # done already if the watch itself failed
            gate.process.wait()
            self.end_cgroup(gate.leader)
            return self.finish(State.LOST, None, None)

    def go(self, record: Record, gate: Gate, output: OutputFile) -> float | StateName:
        """Steps 4 and 5: the record names the group, then `G` lets the program
        run and the sandbox's init is recorded. The boot-time clock at `G`; or
        the state to end in when nothing ran (a stop came first, or its limits
        could not be set)."""
        pid, launch = gate.process.pid, gate.launch
        # 4. The record names the group before anything runs.
        record.update({
            "state": State.RUNNING, "group": pid, "leader_pid": pid,
            "leader_start": records.process_start(pid), "boot_id": records.boot_id(),
            "inode": output.inode, "kept_from": 0, "bytes": 0,
            "cgroup": gate.leader.cgroup.as_record() if gate.leader.cgroup is not None else None,
        })
        # Not synced (a millisecond off the program's way): a sweep reads it whole, and a crash of the
        # machine ends the group too; the sandbox's init, recorded next, or the end is synced.
        self.save(record, synced=False)  # on a full state folder, the program waits for room to record it
        if os.path.exists(self.stop_path):
            return self.stop_state()
        began = boottime()
        nothing_ran = gate.let_run()  # the sandbox is ended through its init, and a sweep finds it in the record
        if nothing_ran is not None:
            logger.warning(f"nothing ran: {nothing_ran}")
            return State.FAILED_TO_START
        launch = gate.running
        if launch.no_internet:
            logger.warning(f"no internet for this command: {launch.no_internet}")
        if launch.init_pid is not None:  # found with its pidfd
            record.update({"init_pid": launch.init_pid, "init_start": records.process_start(launch.init_pid)})
            try:
                records.write(self.state, self.id, record)
            except OSError as problem:  # the pipe must not wait: the next write of the record carries it
                logger.warning(f"cannot record the sandbox's init yet: {problem}")
        return began

    def nothing_ran(self, gate: Gate | Exception | None, state: StateName) -> int:
        """Before `G`: the gate, if any, let go of without running anything, and the end recorded."""
        if isinstance(gate, Gate):
            self.let_nothing_run(gate)
        return self.finish(state, None, None)

    def let_nothing_run(self, gate: Gate) -> None:
        """The gate let go of without `G`; its cgroup removed, and the input's port closed."""
        gate.let_go_of()
        self.end_cgroup(gate.leader)
        if self.port is not None:
            self.port.close()

    # -- step 2 ---------------------------------------------------------------

    def watch_stop(self) -> None:
        try:
            from .watch import watch_paths  # here, on the watch thread: it loads watchdog

            # The stop file, and a sweep's wake file while we tell (§4).
            watched = (self.stop_path, layout.path(self.state, self.id, layout.WAKE))
            self.observer = watch_paths(self.state, watched, self.wake_for_stop)
            self.poll_every = None
        except OSError as problem:  # inotify instances or watches ran out
            logger.warning(f"cannot watch the state folder ({problem}); checking for a stop every 250 ms")
            self.poll_every = 0.25
        try:
            os.write(self.wake_w, b"w")  # the loop looks for the stop file once more
        except BlockingIOError:
            pass

    def wake_for_stop(self) -> None:
        try:
            os.write(self.wake_w, b"s")
        except BlockingIOError:
            pass  # a wake is already pending

    # -- step 3 ---------------------------------------------------------------

    def open_input(self) -> None:
        """The input's port listens; a file given is removed, the gate holding it (after the go: the state folder's)."""
        assert self.port is not None
        self.port.listen()
        if self.port.given:
            os.unlink(layout.path(self.state, self.id, layout.INPUT))

    # -- steps 5 to 8: one loop -----------------------------------------------

    def loop(self, gate: Gate, output: OutputFile, began: float) -> int:
        launch = gate.launch
        watch = Watch(gate.leader, began + self.record["timeout"], log=logger.info,
                      stages=(Stage("SIGTERM to the program's session", lambda: self.terminate(gate.process.pid),
                                    TERM_GRACE),))
        if self.record.get("tell_on"):
            from .tellon import LineTeller  # only here: it loads RE2 and the way in's sender

            try:
                self.teller = LineTeller(self.state, self.record, self.wake_w, logger.warning)
                self.teller.attach(output)
            except Exception as problem:  # noqa: BLE001 - its lines go untold; the command runs all the same
                logger.warning(f"cannot look for tell_on lines: {problem!r}")
                self.teller, output.scan = None, None
        watch.drain(gate.out_r, output.pump if self.port is None else self.port.following(output.pump))
        watch.on_ready(self.wake_r, select.POLLIN, self.empty_wake_pipe)
        if self.port is not None:
            self.port.attach(watch, gate.process.pid)
        from ..sandboxing.gitcheck import Meanwhile  # the git check while the program runs too
        watch.run(self.look_for_a_stop if launch.git is None else
                  Meanwhile(launch.git, [], self.look_for_a_stop, lambda note: logger.warning(f"git check: {note}")))
        if self.port is not None:
            self.port.close()  # it ended: a write is refused from now on (else at our exit)
        gate.process.wait()
        self.end_cgroup(gate.leader)
        gate.close_launch()  # with the git check: every process of the sandbox has ended
        for note in launch.git_notes:
            logger.warning(f"git check: {note}")
        os.close(gate.out_r)
        from ..sandboxing.fallback import bitten_at_end  # limits no cgroup holds: signs in the output's end

        # A command stopped or timed out did not end by a limit, whatever its output's end says.
        by_rlimit = bitten_at_end(launch.holding, watch.exit, watch.signal, output.last) if watch.ending is None else None
        output.finish()
        if self.teller is not None:
            self.teller.finish()
        # The reason given to watch.stop (a state of ours), or its own "timed out".
        ending = next((state for state in records.ENDED_STATES if state == watch.ending), None)
        if self.record.get("limit") is None:
            self.record["limit"] = by_rlimit
        if ending is None and self.signalled is not None:
            ending = State.LOST
        return self.finish(ending or State.EXITED, watch.exit, watch.signal)

    def end_cgroup(self, leader: Leader) -> None:
        """Which limit bit, for the record; then the group goes, with whatever is left in it."""
        if (group := leader.cgroup) is not None:
            self.record["limit"] = group.limit_hit()
            group.remove()

    def look_for_a_stop(self, watch: Watch) -> float | None:
        """At each wake: the agent's service stopping (a signal), or a stop file (step 8)."""
        if watch.ending is None and not watch.exited:
            if self.signalled is not None:
                watch.stop(State.LOST)
            elif os.path.exists(self.stop_path):
                watch.stop(self.stop_state())
        soon = self.teller.tick() if self.teller is not None else None
        return soon if self.poll_every is None else self.poll_every if soon is None else min(soon, self.poll_every)

    def empty_wake_pipe(self) -> None:
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def terminate(self, gate_pid: int) -> None:
        """SIGTERM to the program's own session inside the sandbox (on its terminal, with tty), else to the
        gate's group."""
        program = program_session(gate_pid) if "--new-session" in self.record["argv"] else None
        if program is not None and self.record.get("tty"):
            program = terminal_session(program) or program
        kill_group(program if program is not None else gate_pid, signal.SIGTERM)

    def stop_state(self) -> StateName:
        """The stop file's reason, read once: the first reason wins."""
        if self.stopped_for is None:
            try:
                with open(self.stop_path, "rb") as f:
                    reason = f.read(64).decode("utf-8", "replace").strip()
            except OSError:
                reason = ""
            self.stopped_for = State.LOST if reason == AGENT_STOPPING else State.STOPPED
        return self.stopped_for

    # -- step 5 hook, and step 9 ----------------------------------------------

    def rotated(self, fields: Rotated) -> None:
        """(c) of a rotation: the record names the new file (and the one before
        it) before it takes the old one's place. A failed write raises, and
        the rotation is not made: the pipe must never wait for room."""
        rotated: Record = {**self.record, **fields}
        records.write(self.state, self.id, rotated)
        self.record.update(rotated)  # the same dict: the tell_on teller holds it too

    def save(self, record: Record, synced: bool = True) -> None:
        """Write the record; on a full disk, try again (each wait twice the
        last, up to FULL_RETRY_MOST) until there is room. We hold the lock
        meanwhile, so no sweep takes the command for lost."""
        pause = FULL_RETRY_FIRST
        while True:
            try:
                records.write(self.state, self.id, record, synced)
                return
            except OSError as error:
                if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                if pause == FULL_RETRY_FIRST:
                    logger.warning(f"the state folder is full ({error.strerror}): the record waits for room")
            time.sleep(pause)
            pause = min(2 * pause, FULL_RETRY_MOST)

    def finish(self, state: StateName, exit_code: int | None, signal_number: int | None) -> int:
        record = self.record
        record.update({"state": state, "ended": records.now(), "exit": exit_code,
                       "signal": signal_name(signal_number) if signal_number is not None else None})
        if self.output is not None:
            record.update({"inode": self.output.inode, "kept_from": self.output.kept_from,
                           "bytes": self.output.total, "dropped": self.output.dropped})
        if record.get("told") != Told.NO_WAY_IN:
            record["told"] = Told.UNTOLD
        try:
            self.save(record)
        except OSError as problem:  # the state folder is gone (removed): nothing to record in
            logger.error(f"cannot record the end: {problem}")
            os.close(self.lock_fd)
            return 1
        logger.info(f"ended: {state}, exit {exit_code}, signal {record['signal']}, {record.get('bytes', 0)} bytes")
        # A lost command (the agent or its service stopping) is told by the
        # sweep when the agent is back, not now.
        if record["told"] == Told.UNTOLD and state != State.LOST:
            self.tell()
        # Done with the record: free it now, not after the teardown below, so
        # that `stop --state` and sweeps need not wait for the watch to end.
        os.close(self.lock_fd)
        # What this process loaded of ours, for the log (and a test that keeps it small).
        ours = sorted(name for name in sys.modules if name.startswith("linkrun."))
        logger.info("loaded " + " ".join(ours))
        if self.watching.is_alive():
            self.watching.join()
        if self.observer is not None:
            self.observer.stop()
        return 0

    def tell(self) -> None:
        """Step 9: tell the conversation through the way in (§4)."""
        from ..messages import telling

        telling.tell_from_supervisor(self.state, self.id, self.record, logger.info, last_bytes, self.wake_r,
                                     stopping=lambda: self.signalled is not None, poll_every=self.wake_poll)

    def wake_poll(self) -> float | None:
        """How often the telling looks for a wake file itself: never while the
        watch is set or being set (its byte wakes us, and a wake file written
        before it was set is seen then), every 250 ms without one."""
        if self.watching.ident is None:
            return 0.25  # never started: the command did not run
        return None if self.poll_every == WATCH_PENDING else self.poll_every

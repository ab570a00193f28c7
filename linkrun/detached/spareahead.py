"""A background command's sandbox made ahead, by the supervisor forked ahead.

bubblewrap's set-up (its namespaces, a mount per bind, its filter) took
most of the way from `start`'s answer to the program: 4 ms on a quiet
machine, 8 on a slow one, after the record named its group. So a
supervisor forked ahead (warm.py), while it waits for its start, makes its
command's sandbox as serve makes a spare for a call (processes/spare.py):
its gate forked ahead is handed the launch of the loader at once, in a
cgroup made for it, and the loader waits on its input for the script; its
init's limits are set, as a launch's are, before the loader runs. What it
needs to know of the sandbox, serve gives the warm fork server once
(`Background.sandbox_fields`: the same for each of its commands).

At its start the supervisor prepares the command's launch as before (its
folder opened beneath the files folder, its git check) and takes the spare
when a sandbox made now would show the same (`Launch.key`), for the same
fields, with no input file given and a script short enough, and while it
still runs: the record then names the spare's group, and the script is
written where `G` would have been (the loader's ACK read before any
output). Otherwise the spare ends, and the command gets the sandbox made
for it, as before.

Nothing runs before the record names its group: the loader is ours, and
runs nothing but what it is handed after. A supervisor that dies leaves a
loader that reads end of file and exits, in a sandbox that its bwrap's
death signal ends; its empty cgroup is an orphan's (`cgroups.end_orphans`).
With the internet, the agent's proxy listens in it from its making, as
in a call's spare: one is made only while the proxy answers, and taken
only while that proxy runs (its pidfd), for its listener ends with it.
"""

from __future__ import annotations

import os
import select

from ..processes.spare import LOADER_TAIL, Spare, script

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..processes.group import Leader
    from ..sandboxing.launch import Launch, Sandbox
    from ..state.records import Record
    from .gate import Ahead, Gate
    from .input import InputPort

# The record's fields a sandbox is made from: serve's, the same for each of its commands.
FIELDS = ("argv", "files", "write", "proxy", "seccomp", "limits", "timeout")


class MadeAhead:
    """The spare, the fields it was made with, and our ends of its pipes: its
    input (the script, then the program's input) and its output."""

    def __init__(self, spare: Spare, fields: dict[str, Any], input_w: int, out_r: int, proxy: int | None) -> None:
        self.spare, self.fields, self.input_w, self.out_r = spare, fields, input_w, out_r
        self.proxy = proxy  # with the internet: a pidfd of the proxy that listens in it

    def script_for(self, record: Record, launch: Launch) -> bytes | None:
        """The loader's script for the record's program (its input a pipe of
        ours), when the spare shows what `launch`, made now for it, would:
        the same fields, the same key, and it still runs; else None."""
        if any(record.get(name) != self.fields.get(name) for name in FIELDS) or launch.key != self.spare.key:
            return None
        if self.proxy is not None and select.select([self.proxy], [], [], 0)[0]:
            return None  # that proxy exited, and its listener in the sandbox with it
        return script(list(record["program_argv"]), record["folder"], record["files"], True) \
            if self.spare.running() else None

    @property
    def leader(self) -> Leader:
        return self.spare.leader

    @property
    def launch(self) -> Launch:
        return self.spare.launch

    def taken(self, record: Record, state: str, command_id: str) -> tuple[Gate, InputPort] | None:
        """Step 3 for a supervisor with a sandbox made ahead: the sandbox as the
        command's gate, when it shows what the command's launch (made now,
        without a group of its own) would; else None, it ended (and whatever
        kept it from being taken is met again as one is made now)."""
        from ..state import layout
        from .gate import Gate
        from .input import InputPort

        launch = None
        try:
            if not os.path.lexists(layout.path(state, command_id, layout.INPUT)):  # else its input is that file
                launch = _prepared(record)
                script = self.script_for(record, launch)  # its key read while what it binds is open
                launch.handed_over()  # never spawned: what a child would be handed is not needed
                if script is not None:
                    port = InputPort(state, command_id, bool(record.get("tty")), pipe=self.input_w)
                    gate = Gate(self.leader.process, launch, -1, self.out_r, self, script)
                    self.input_w = self.out_r = -1  # the port's and the gate's now
                    return gate, port
        except Exception:  # noqa: BLE001 - a sandbox made now meets it again, and says it
            pass
        self.end()
        if launch is not None:
            launch.close()
        return None

    def hand_over(self, data: bytes) -> bool:
        """The script to the loader, and its ACK read: `Spare.hand_over`."""
        return self.spare.hand_over(data, True)

    def let_go(self) -> None:
        """Not run: killed with all it holds, and reaped; its group is the caller's to remove."""
        self.spare.leader.abandon()
        self.close()
        for fd in (self.input_w, self.out_r):
            if fd >= 0:
                os.close(fd)  # those not handed on to the input's port and the gate
        self.input_w = self.out_r = -1

    def close(self) -> None:
        """Once its sandbox ended: what it holds let go (`Spare.close`), and the proxy's pidfd."""
        self.spare.close()
        if self.proxy is not None:
            os.close(self.proxy)
            self.proxy = None

    def end(self) -> None:
        """Not taken: let go of, and its group removed."""
        self.let_go()
        if self.spare.group is not None:
            self.spare.group.remove()


def make(fields: dict[str, Any], gate: Ahead, state: str) -> MadeAhead | None:
    """The sandbox for serve's `fields`, made by the gate forked ahead, which
    becomes its bwrap at once; None, the gate left as it was, for a
    pass-through sandbox, or one with the internet while the agent's proxy
    does not answer (a start starts it). Raises what kept it from being made
    (OSError when its bwrap ended before its init, or the proxy did not
    listen in it), the gate used up or closed, and what it made ended."""
    from ..sandboxing.launch import Sandbox

    box = Sandbox.of_record(fields)
    proxy = None
    if fields.get("proxy"):
        from ..network.internet import answering

        proxy = answering(state)
    if not box.real or (fields.get("proxy") and proxy is None):
        return None  # the gate is left as it is
    try:
        made = _made(box, fields, gate, proxy)
    except BaseException:
        if proxy is not None:
            os.close(proxy)
        raise
    try:
        made.spare.leader.sandbox_init = made.spare.launch.init_pidfd()  # its limits set, its proxy listening
    except BaseException:
        made.end()
        raise
    if made.spare.leader.sandbox_init is None or made.spare.launch.no_internet is not None:
        made.end()
        raise OSError(made.spare.launch.no_internet or "its bwrap ended before its init")
    return made


def _made(box: Sandbox, fields: dict[str, Any], gate: Ahead, proxy: int | None) -> MadeAhead:
    """The sandbox spawned, its loader held until its init's limits are set (`make`)."""
    from ..processes.group import Leader, grow_pipe
    from ..sandboxing.launch import prepare

    files_fd = os.open(box.files, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    opened: list[int] = []
    launch = None
    try:
        launch = prepare(box, LOADER_TAIL, "", files_fd, git_check=False)  # its command's launch looks
        key = launch.key
        input_r, input_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        control_r, control_w = os.pipe2(os.O_CLOEXEC)
        opened += [input_r, input_w, out_r, out_w, control_r, control_w]
        grow_pipe(out_r)
        os.write(control_w, b"G")  # the loader is what waits: its sandbox is made at once
        process = gate.hand(launch, input_r, out_w, control_r, files_fd)
        launch.handed_over()
        # Spare.hand_over's ends of the loader's pipes, which MadeAhead closes.
        process.stdin = os.fdopen(input_w, "wb", buffering=0, closefd=False)
        process.stdout = os.fdopen(out_r, "rb", buffering=0, closefd=False)
        leader = Leader(process)
        leader.cgroup = launch.take_group()
        spare = Spare(key, launch, leader, leader.cgroup)
        launch = None  # the spare's now
    except BaseException:
        gate.close()
        if launch is not None:
            launch.close()  # and its group, which nothing joined
        for fd in opened:
            os.close(fd)
        raise
    finally:
        os.close(files_fd)
    for fd in (input_r, out_w, control_r, control_w):
        os.close(fd)  # the gate holds them
    return MadeAhead(spare, fields, input_w, out_r, proxy)


def _prepared(record: Record) -> Launch:
    """The record's launch, without a cgroup, its folder opened beneath the
    files folder: Refused for a link planted since start."""
    from ..sandboxing import beneath
    from ..sandboxing.launch import Sandbox, prepare

    files_fd = os.open(record["files"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.close(beneath.open_folder(files_fd, record["folder"]))
        return prepare(Sandbox.of_record(record), record["program_argv"], record["folder"], files_fd, grouped=False)
    finally:
        os.close(files_fd)

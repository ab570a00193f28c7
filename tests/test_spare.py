"""The sandbox made ahead of a call (linkrun/processes/spare.py), through a
real `up` as root and as an ordinary user: a program finds in it exactly
what a sandbox made for its call gives, a spare made before a change on the
host is not taken, and none outlives serve.

Which sandbox a call ran in is told from inside: a spare's init was started
with the loader (its command line holds it), a sandbox made for the call
with the program. A call whose script is over SCRIPT_LIMIT always gets a
sandbox made for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import (descendants, kill_quietly, parent_of, pid_alive, require_sandbox, spare_ready as waiting_spare, spares_of, text_of,
                      wait_for, waiting_spares)
from linkrun.sandboxing import strays
from linkrun.processes import spare as spare_module
from linkrun.processes.spare import SCRIPT_LIMIT
from up_harness import Up, processes_with, program_runs, running_as_root, start_up

# The loader's first words, put together inside so that this script itself never holds them.
IN_SPARE = 'r="read -r"; if tr "\\0" " " </proc/1/cmdline | grep -q "IFS= $r n"; then echo spare; else echo made; fi'
FINGERPRINT = IN_SPARE + """
env | sort
ls /proc/self/fd
pwd
grep -E '^(Sig(Blk|Ign)|NoNewPrivs|Seccomp|Cap(Inh|Prm|Eff|Bnd|Amb)|Uid|Gid|Groups|NSpid)' /proc/self/status
ulimit -a
cat /proc/self/cgroup /proc/self/uid_map
stat -L -c %F /proc/self/fd/0
grep -E '^(flags|pos)' /proc/self/fdinfo/0
awk '{print $5, $6}' /proc/self/mountinfo
ls -a
"""
PADDING = "#" * SCRIPT_LIMIT  # a script this long gets a sandbox made for its call


def call(up: Up, script: str, *more: str, folder: str = "work", input: str | None = None) -> tuple[str, str]:
    """(which sandbox, what the program printed after that line)."""
    arguments: dict[str, object] = {"program": "sh", "args": ["-c", script, *more], "folder": folder}
    if input is not None:
        arguments["input"] = input
    result = up.server.call("command", arguments, timeout=60)
    assert not result.get("isError"), text_of(result)
    output = result["structuredContent"]["output"]
    which, _, rest = output.partition("\n")
    return which, rest


def spare_ready(up: Up) -> None:
    waiting_spare(up.server.process.pid)


def test_a_program_in_a_spare_finds_what_a_sandbox_made_for_its_call_gives(up_as: Up) -> None:
    (up_as.agent / "Files" / "work" / "sub").mkdir(parents=True, exist_ok=True)
    made = call(up_as, FINGERPRINT, PADDING, folder="work/sub")
    spare_ready(up_as)
    spared = call(up_as, FINGERPRINT, folder="work/sub")
    assert made[0] == "made" and spared[0] == "spare"
    assert spared[1] == made[1]
    assert "/work/sub\n" in made[1] and "character special file" in made[1]


def test_a_program_in_a_spare_gets_its_arguments_and_its_input_byte_for_byte(up_as: Up) -> None:
    spare_ready(up_as)
    odd = ["it's", "two\nlines", "$(touch gotcha)", "\\", "", "  spaced  ", "*", "1", "-- end"]
    which, args = call(up_as, IN_SPARE + '; for a in "$@"; do printf "<%s>" "$a"; done', *odd)
    assert which == "spare"
    assert args == "".join(f"<{a}>" for a in odd[1:])  # the first is $0
    given = "3\nexec true\nnot a script\n'\\\n" + "x" * 5000 + "\nend"
    spare_ready(up_as)
    which, output = call(up_as, IN_SPARE + "; cat", input=given)
    assert which == "spare"
    assert output == given
    assert not (up_as.agent / "Files" / "work" / "gotcha").exists()


def test_a_spare_made_before_a_repository_appeared_is_taken_and_what_its_program_plants_is_set_aside(
        up_as: Up) -> None:
    # No repository is bound over (the git check): a spare shows what a
    # sandbox made now would, and the call's own look, taken at the call, checks it.
    spare_ready(up_as)
    owner = os.stat(up_as.agent / "Files" / "work")
    hooks = up_as.agent / "Files" / "work" / "repo" / ".git" / "hooks"
    hooks.mkdir(parents=True)
    for path in (hooks.parent.parent, hooks.parent, hooks):
        os.chown(path, owner.st_uid, owner.st_gid)
    which, output = call(up_as, IN_SPARE + "; echo planted > repo/.git/hooks/pre-commit 2>&1; echo $?")
    assert which == "spare" and output.strip() == "0"
    assert not (hooks / "pre-commit").exists()
    assert os.listdir(hooks)[0].startswith("pre-commit.lnk-set-aside-")


def test_a_spare_made_before_its_folder_was_replaced_is_not_taken(up_as: Up) -> None:
    spare_ready(up_as)
    files = up_as.agent / "Files"
    owner = os.stat(files / "work")
    os.rename(files / "work", files / "work-before")
    (files / "work").mkdir()
    (files / "work" / "now").write_text("")
    os.chown(files / "work", owner.st_uid, owner.st_gid)
    which, output = call(up_as, IN_SPARE + "; ls")
    assert which == "made"
    assert output.split() == ["now"]


def test_no_spare_outlives_serve_closed_or_killed(up_as: Up) -> None:
    spare_ready(up_as)
    serve = up_as.server.process.pid  # up runs serve in its own process
    spares = spares_of(serve)
    assert spares and spares[0] in descendants(serve)
    os.kill(serve, signal.SIGKILL)
    # Ended: a zombie counts (serve's orphans are reaped by whoever is pid 1, in its own time).
    wait_for(lambda: not any(pid_alive(pid) for pid in spares), timeout=30, what="the spares to end with serve")


def test_serve_closed_right_after_a_call_leaves_no_sandbox_behind(up_as: Up) -> None:
    # The call's end starts the next spare: serve's end waits until it is
    # made, and ends it. A bwrap cut off in its set-up would leave its init
    # waiting forever for a parent that is gone.
    call(up_as, "true")
    up_as.server.process.stdin.close()
    assert up_as.server.process.wait(timeout=30) == 0
    wait_for(lambda: not processes_with(str(up_as.agent)), timeout=10, what="every process of the agent to end")


def test_a_new_serve_ends_the_sandboxes_a_killed_one_left_behind(up_as: Up, request) -> None:
    # A serve killed in the moment bwrap sets up leaves the sandbox nobody's:
    # made here as an orphan of a shell that exits, its program running on,
    # its output a pipe that no parent of it reads.
    files = str(up_as.agent / "Files")
    tag = up_as.tag()
    orphan = (f"(bwrap --unshare-all --ro-bind / / --ro-bind {files} {files} --info-fd 3 "
              f"-- sh -c 'sleep 1000' {tag} 3>/dev/null </dev/null 2>&1 | cat >/dev/null &)")
    owner = os.stat(files)
    subprocess.run(["sh", "-c", orphan], check=True, user=owner.st_uid, group=owner.st_gid, cwd="/")
    wait_for(lambda: processes_with(tag), timeout=10, what="the orphaned sandbox's program")
    # A call of the first serve still runs while the second starts: it is no stray.
    up_as.server.send({"jsonrpc": "2.0", "id": "long", "method": "tools/call", "params": {
        "name": "command", "arguments": {"program": "sh", "args": ["-c", "sleep 2; echo lived"]}}})
    runtime = request.getfixturevalue("readable_runtime") if up_as.who == "user" and running_as_root() else None
    second = start_up(up_as.who, up_as.agent.parent, runtime, again=up_as)
    try:
        wait_for(lambda: not processes_with(tag), timeout=10, what="the stray sandbox to be ended")
        answer = up_as.server.wait_response("long", timeout=30)
        assert "lived" in answer["result"]["structuredContent"]["output"]
    finally:
        second.server.kill()


def spare_processes(up: Up) -> list[dict[str, int]]:
    """Each waiting spare's outer bwrap (serve's child), its init (the outer's), and its loader (the init's)."""
    serve = up.server.process.pid
    found = spares_of(serve)
    spares = []
    for outer in (pid for pid in found if parent_of(pid) == serve):
        init = next(pid for pid in found if parent_of(pid) == outer)
        spares.append({"outer": outer, "init": init, "loader": next(pid for pid in found if parent_of(pid) == init)})
    return spares


@pytest.mark.parametrize("killed, stopped", [("loader", "init"), ("init", "outer"), ("outer", None)])
def test_a_spare_killed_from_outside_is_never_handed_a_call(up_as: Up, killed: str, stopped: str | None) -> None:
    """Killed, then a call at once: the call runs its program in a sandbox
    made for it. The process that would notice the death first is stopped
    meanwhile, so that the call surely comes before it did."""
    waiting_spare(up_as.server.process.pid, spare_module.AHEAD)
    spares = spare_processes(up_as)
    assert len(spares) == spare_module.AHEAD
    try:
        for pids in spares:  # every spare: the call has none left to take
            if stopped is not None:
                os.kill(pids[stopped], signal.SIGSTOP)
            os.kill(pids[killed], signal.SIGKILL)
        result = up_as.server.call("command", {"program": "sh", "args": ["-c", IN_SPARE + "; echo ran"],
                                               "folder": "work"}, timeout=20)
    finally:
        for pids in spares:
            if stopped is not None:
                kill_quietly(pids[stopped], signal.SIGCONT)
    assert not result.get("isError") and result["structuredContent"]["exit"] == 0, text_of(result)
    assert result["structuredContent"]["output"].split() == ["made", "ran"]
    spare_ready(up_as)  # after a quiet while, spares again
    assert call(up_as, IN_SPARE)[0] == "spare"


def burst(up: Up, size: int, first_id: int) -> list[str]:
    """`size` calls sent at once, each holding the others for a moment: which sandbox each ran in."""
    ids = [f"burst-{first_id + n}" for n in range(size)]
    for request_id in ids:
        up.server.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {
            "name": "command", "arguments": {"program": "sh", "args": ["-c", IN_SPARE + "; sleep 0.3"]}}})
    answers = [up.server.wait_response(request_id, timeout=60)["result"] for request_id in ids]
    return [answer["structuredContent"]["output"].strip() for answer in answers]


def test_after_calls_at_once_as_many_spares_wait_for_the_next_such_burst(up_as: Up) -> None:
    spare_ready(up_as)
    first = burst(up_as, 4, 0)
    # the spares kept at rest were taken, and those made while the burst came
    assert first.count("spare") >= spare_module.AHEAD, first
    wait_for(lambda: waiting_spares(up_as.server.process.pid) == 4, timeout=30, what="four spares")
    assert burst(up_as, 4, 4) == ["spare"] * 4


class StandIn:
    """For tests of the pool alone, in this process: a spare's launch and its
    leader, stand-ins whose timing is their own. The leader's pidfd is one
    of this process, never readable while the test runs: a spare that runs."""

    def __init__(self, pidfd: int) -> None:
        process = type("Process", (), {"pid": None})()  # no status of its own to hold (Spare.statuses)
        self.leader = type("Running", (), {"pidfd": pidfd, "sandbox_init": None, "process": process})()

    def prepare(self) -> tuple[object, str]:
        return type("Held", (), {"close": lambda self: None, "init_pid": None})(), "shown"

    def spare(self, key: str) -> spare_module.Spare:
        launch, _ = self.prepare()
        return spare_module.Spare(key, launch, self.leader, None)


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    pidfd = os.pidfd_open(os.getpid())
    yield StandIn(pidfd)
    os.close(pidfd)


def test_the_spares_of_a_burst_go_back_to_one_once_it_lingered(monkeypatch, stand_in: StandIn) -> None:
    # The pool alone, in this process, its spares stand-ins: its timing is its own.
    monkeypatch.setattr(spare_module, "LINGER", 0.3)
    made: list[spare_module.Spare] = []
    ended: list[spare_module.Spare] = []

    def start(launch, key):
        made.append(stand_in.spare(key))
        return made[-1]

    spares = spare_module.Spares(stand_in.prepare, start, ended.append, ahead=1, makers=1)
    spares.make()
    wait_for(lambda: len(made) == 1, what="the first spare")
    # three calls at once: one finds the spare, two make their own sandboxes
    taken = [spares.take("shown"), spares.take("shown", use=False), spares.take("shown", use=False)]
    assert taken[0] is made[0] and taken[1:] == [None, None]
    for _ in taken:
        spares.done(True)
    wait_for(lambda: len(made) == 4, what="three spares made for the next burst")
    assert not ended
    wait_for(lambda: len(ended) == 2, timeout=5, what="the burst's extra spares ended once it lingered")
    assert spares.take("another") is None  # shows other things now: ended, never taken
    spares.done(True)
    wait_for(lambda: len(ended) == 3, what="the stale spare ended")
    spares.close()
    assert len(ended) == len(made) - 1  # the one taken is its call's


LAUNCHER = """
import subprocess, sys
box = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
box.stdout.read()
"""


def test_a_sandbox_whose_launcher_reads_its_output_is_no_stray_however_it_was_started(tmp_path: Path) -> None:
    # serve runs as `lnk-link-run up` (its command line need not name the
    # package); what marks a live launch is that its launcher reads its output.
    require_sandbox()
    files = str(tmp_path / "Files")
    os.makedirs(files)
    tag = f"lnk-left-behind-{os.getpid()}-{time.monotonic_ns()}"
    box = ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--ro-bind", files, files, "--info-fd", "2",
           "--", "sh", "-c", "sleep 1000; :", tag]
    launcher = subprocess.Popen([sys.executable, "-I", "-S", "-c", LAUNCHER, *box])
    try:
        wait_for(lambda: program_runs(tag), timeout=10, what="the launched sandbox's program")
        assert strays.find(files) == []
        launcher.kill()  # its sandbox is an orphan now, its program running on
        launcher.wait()
        wait_for(lambda: strays.find(files), timeout=10, what="the orphan to be seen as a stray")
        assert strays.end(files) >= 1
        wait_for(lambda: not processes_with(tag), timeout=10, what="the stray sandbox to end")
    finally:
        launcher.kill()
        launcher.wait()
        for pid in processes_with(tag):
            kill_quietly(pid)


def test_the_loader_hands_the_program_the_environment_it_was_given_under_dash_and_bash() -> None:
    # bash's exec sets SHLVL again after an unset; /bin/sh is bash on Fedora and Arch.
    # The folder entered too: its `cd` sets PWD and OLDPWD, which go as well.
    shells = [shell for shell in ("/bin/dash", "/bin/bash", "/bin/sh") if os.path.exists(shell)]
    for folder in ("", "tmp"):
        data = spare_module.script(["/usr/bin/env"], folder, "/", has_input=False)
        assert data is not None
        for shell in shells:
            done = subprocess.run([shell, "-c", spare_module.LOADER], input=data, env={"KEPT": "1"}, cwd="/",
                                  capture_output=True, check=True)
            assert done.stdout == spare_module.ACK + b"KEPT=1\n", (shell, folder, done.stdout)  # its word, the program's


def test_a_script_cut_short_runs_nothing_under_dash_and_bash_with_or_without_dev_stdin() -> None:
    # A call without input hands the loader its script as the rest of the pipe
    # (`.` reads it at once): one `{ }` group, which the shell parses whole
    # before it runs any of it, so a script cut short (serve killed as it
    # wrote) runs none of its program, however short. Where /dev/stdin is
    # missing the loader reads the lines itself, with the same result.
    shells = [shell for shell in ("/bin/dash", "/bin/bash", "/bin/sh") if os.path.exists(shell)]
    data = spare_module.script(["/bin/echo", "RAN"], "tmp", "/", has_input=False)
    assert data is not None and data.startswith(b"0\n")
    for wrapper in ([], ["bwrap", "--dev-bind", "/", "/", "--tmpfs", "/dev", "--"]):
        if wrapper:
            require_sandbox()
        for shell in shells:
            whole = subprocess.run([*wrapper, shell, "-c", spare_module.LOADER], input=data, capture_output=True)
            assert whole.stdout == spare_module.ACK + b"RAN\n", (wrapper, shell, whole)
            for cut in range(len(b"0\n"), len(data) - 1):
                done = subprocess.run([*wrapper, shell, "-c", spare_module.LOADER], input=data[:cut],
                                      capture_output=True)
                assert b"RAN" not in done.stdout and done.returncode != 0, (wrapper, shell, cut, done)


def test_calls_at_once_do_not_queue_behind_a_spare_being_made(stand_in: StandIn) -> None:
    # The pool alone: while a spare is being made, one call may wait for it,
    # the others make their own at once.
    made = threading.Event()

    def start(launch, key):
        made.wait(30)  # the making in its slow part
        return stand_in.spare(key)

    spares = spare_module.Spares(stand_in.prepare, start, lambda spare: None)
    spares.make()
    answers: list[object] = []
    calls = [threading.Thread(target=lambda: answers.append(spares.take("shown"))) for _ in range(4)]
    for call in calls:
        call.start()
    wait_for(lambda: len(answers) == 3, timeout=10, what="three calls to go on without the spare")
    assert answers == [None, None, None]
    made.set()
    for call in calls:
        call.join(10)
    assert isinstance(answers[3], spare_module.Spare)
    for _ in calls:
        spares.done(True)
    spares.close()


def test_a_failing_job_turns_the_spares_off_and_no_call_waits_for_them(stand_in: StandIn) -> None:
    def end(spare) -> None:
        raise OSError("the group could not be killed")

    made: list[spare_module.Spare] = []

    def start(launch, key):
        made.append(stand_in.spare(key))
        return made[-1]

    spares = spare_module.Spares(stand_in.prepare, start, end)
    spares.make()
    wait_for(lambda: spares.ready, what="a spare")  # made, and not only started: else no spare is stale
    assert spares.take("other") is None  # stale: its end, on the thread, fails
    spares.done(True)
    wait_for(lambda: spares.off is not None, what="the spares turned off")
    done = threading.Event()
    threading.Thread(target=lambda: (spares.take("shown"), done.set())).start()
    assert done.wait(10), "a call waited for spares that are off"
    spares.done(True)
    spares.close()


def ended_pidfd() -> int:
    """A pidfd of a process that has ended: the leader of a spare whose bwrap was killed."""
    child = subprocess.Popen(["sleep", "1000"])
    pidfd = os.pidfd_open(child.pid)
    child.kill()
    child.wait()
    return pidfd


def test_a_spare_ended_before_its_call_pauses_the_spares_and_only_repeated_ones_turn_them_off(
        monkeypatch, stand_in: StandIn, capsys) -> None:
    # The pool alone: each spare it makes has ended before its call comes.
    monkeypatch.setattr(spare_module, "QUIET", 1.0)
    dead = ended_pidfd()
    made: list[spare_module.Spare] = []

    def start(launch, key):
        made.append(StandIn(dead).spare(key))
        return made[-1]

    spares = spare_module.Spares(stand_in.prepare, start, lambda spare: None, ahead=1, makers=1)
    spares.make()
    try:
        for n in range(1, spare_module.FAILURES_OFF + 1):
            wait_for(lambda n=n: len(made) == n, timeout=10, what=f"spare {n}, made again after a quiet while")
            assert spares.take("shown") is None  # ended: never handed to the call
            spares.done(True)
            assert len(made) == n  # none made in the quiet while
            assert (spares.off is None) == (n < spare_module.FAILURES_OFF)
        said = [line for line in capsys.readouterr().err.splitlines() if "from now on" in line]
        assert len(said) == 1 and "ended before their calls" in said[0], said
    finally:
        spares.close()
        os.close(dead)


def test_calls_back_to_back_each_run_in_a_sandbox_of_their_own(up_as: Up) -> None:
    # The spares are made by several makers while calls take them: still one sandbox a call.
    waiting_spare(up_as.server.process.pid, spare_module.AHEAD)
    seen = [call(up_as, IN_SPARE + "; readlink /proc/self/ns/pid /proc/self/ns/mnt") for _ in range(3 * spare_module.AHEAD)]
    assert [which for which, _ in seen].count("spare") >= spare_module.AHEAD, seen
    namespaces = [rest for _, rest in seen]
    assert len(set(namespaces)) == len(namespaces), namespaces


def test_spares_are_made_at_once_by_each_maker_bounded_and_each_taken_by_one_call(stand_in: StandIn) -> None:
    # The pool alone: two makers make two spares at the same time (each waits
    # for the other inside its making), calls at once each get another spare,
    # and a burst never has more made than MOST.
    together = threading.Barrier(2, timeout=10)
    made: list[spare_module.Spare] = []
    making, most_making = [0], [0]
    lock = threading.Lock()

    def start(launch, key):
        with lock:
            making[0] += 1
            most_making[0] = max(most_making[0], making[0])
        if len(made) < 2:
            together.wait()  # both first spares are in their making at once
        with lock:
            making[0] -= 1
            made.append(stand_in.spare(key))
            return made[-1]

    spares = spare_module.Spares(stand_in.prepare, start, lambda spare: None, ahead=2, makers=2)
    spares.make()
    wait_for(lambda: len(made) == 2, what="two spares made at once")
    taken: list[object] = []
    calls = [threading.Thread(target=lambda: taken.append(spares.take("shown"))) for _ in range(2 * spare_module.MOST)]
    for thread in calls:
        thread.start()
    for thread in calls:
        thread.join(10)
    found = [spare for spare in taken if spare is not None]
    assert len(found) >= 2 and len({id(spare) for spare in found}) == len(found)  # none taken twice
    for _ in calls:
        spares.done(True)
    wait_for(lambda: len(made) - len(found) == spare_module.MOST, what="the burst's spares")
    assert len(made) - len(found) == spare_module.MOST and most_making[0] == 2
    spares.close()


def test_a_spare_is_made_again_at_once_only_when_a_call_took_the_last(monkeypatch, stand_in: StandIn) -> None:
    # The pool alone: while one waits, its successor settles (the answer goes
    # out first); a call that takes the last sets it going at once.
    monkeypatch.setattr(spare_module, "SETTLE", 60.0)
    made: list[spare_module.Spare] = []

    def start(launch, key):
        made.append(stand_in.spare(key))
        return made[-1]

    spares = spare_module.Spares(stand_in.prepare, start, lambda spare: None, ahead=2, makers=1)
    spares.make()
    wait_for(lambda: len(made) == 1, what="the first spare")  # none waited: it did not settle; the next does
    assert spares.take("shown") is made[0]
    wait_for(lambda: len(made) == 2, timeout=10, what="the next, made at once once the last was taken")
    spares.done(True)  # one waits: the next settles
    assert spares.take("shown") is made[1]
    wait_for(lambda: len(made) == 3, timeout=10, what="the next, made at once once the last was taken")
    spares.done(True)
    spares.close()


def test_while_a_call_runs_one_maker_fewer_makes_spares(stand_in: StandIn) -> None:
    # The pool alone, two makers: with a call in flight one spare is made at a
    # time (the call's program needs a core too), with none both at once.
    making: list[threading.Event] = []
    lock = threading.Lock()

    def start(launch, key):
        go = threading.Event()
        with lock:
            making.append(go)
        go.wait(10)
        return stand_in.spare(key)

    spares = spare_module.Spares(stand_in.prepare, start, lambda spare: None, ahead=2, makers=2)
    assert spares.take("shown", use=False) is None  # a call in flight, making its own sandbox
    spares.make()
    wait_for(lambda: len(making) == 1, what="one spare in its making")
    assert len(spares._making) == 1  # decided at once, under the pool's lock: no second one is on its way
    spares.done(True)  # the call ended: the second maker too
    wait_for(lambda: len(making) == 2, what="a second spare made beside the first")
    for go in making:
        go.set()
    spares.close()

"""Per-call limits (DESIGN.md §6): each call, and each background command, in
a cgroup of its own with `[limits] memory`, `tasks` and `cpu`, said in the
answer when one bites. Real `up`, real bubblewrap, real cgroups, real
programs.

A test needing a controller skips where this machine cannot give it (as
root: cgroup v1, or a cgroup v2 group that offers it), unless
LNK_REQUIRE_SANDBOX=1 makes that a failure. The cgroup v2 path is run as far
as a machine whose v2 hierarchy has no controllers lets it: join, kill as a
whole, remove.
"""

from __future__ import annotations

import os
import pwd
import secrets
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import pytest
from conftest import (PASS_THROUGH, parent_of, RawServer, clean_env, is_spare, require_sandbox, serve_argv, text_of,
                      wait_for)
from up_harness import (META, SYSTEM_PATH, Up, ensure_tester, kill_tagged, processes_with, program_runs,
                        running_as_root, start_up, stop_background)

from linkrun.processes.spare import AHEAD
from linkrun.sandboxing import cgroups, keptgroups, sandbox, sandboxfile
from linkrun import config, invocation
from linkrun.messages import told
from linkrun.errors import LinkRunError, UsageError
from linkrun.sandboxing.launch import JOIN, Sandbox, prepare

# Each test starts a real `up` or serve, with real cgroups, and may wait on it: more than the default.
pytestmark = pytest.mark.timeout(240)

MIB = 1024 * 1024
HOG = """
import sys
chunks = []
for _ in range(int(sys.argv[1])):  # bounded: never more than the test allows, limit or not
    chunk = bytearray(1 << 20)
    chunk[::4096] = b"x" * 256  # touched, so that it counts
    chunks.append(chunk)
print("allocated", len(chunks), "MiB")
"""
FLOOD = ("i=0; while [ $i -lt 200 ]; do sleep 30 & i=$((i+1)); done 2>/dev/null; "
         "echo started; kill $(jobs -p) 2>/dev/null; exit 0")
SPIN = """
import os, time
start = time.monotonic()
while time.monotonic() - start < float(os.sys.argv[1]):
    pass
t = os.times()
print(t.user + t.system, time.monotonic() - start)
"""


def linger(tag: str) -> str:
    """A shell command that lingers with `tag` on its command line."""
    return f"sh -c 'sleep 300; :' {tag}"


def require_controllers(*controllers: str) -> cgroups.Place:
    """Skip unless this machine gives each controller, or fail with LNK_REQUIRE_SANDBOX=1 as root.
    Root makes its groups itself; an ordinary user has one only where the machine
    delegates it (a systemd user session), and most containers do not: CI's
    ordinary user skips these, as that user's serve and doctor say the limits do not hold."""
    require_sandbox()
    where = cgroups.find()
    lacking = [c for c in controllers if c not in where.folders]
    if lacking:
        why = "; ".join(where.missing[c] for c in lacking)
        if os.environ.get("LNK_REQUIRE_SANDBOX") == "1" and os.geteuid() == 0:
            pytest.fail(f"no cgroup for {', '.join(lacking)} and LNK_REQUIRE_SANDBOX=1: {why}")
        pytest.skip(f"no cgroup for {', '.join(lacking)}: {why}")
    return where


def limits_file(limits: str) -> str:
    """A sandbox file with these [limits]."""
    return f'[commands]\nallow = ["sh", "python3", "cat", "sleep"]\n[limits]\n{limits}\n'


@pytest.fixture
def limited(tmp_path):
    """Start an `up` as root with the [limits] given; everything of it is ended at the end."""
    started: list[Up] = []

    def start(limits: str) -> Up:
        workdir = tmp_path / f"up{len(started)}"
        workdir.mkdir()
        up = start_up("root", workdir, None, limits_file(limits))
        started.append(up)
        return up

    yield start
    for up in started:
        kill_tagged(up.tags)
        up.server.kill()
        stop_background(up.state)


def groups_of(pid: int) -> list[str]:
    """The call groups this serve made that still exist, in every hierarchy."""
    prefix = f"lnk-{pid}-"
    where = cgroups.find()
    return [os.path.join(folder, name) for folder in set(where.folders.values())
            for name in os.listdir(folder) if name.startswith(prefix)]


def only_kept_groups(groups: list[str]) -> bool:
    """Only the groups serve keeps for its next calls remain, and nothing is in
    them but serve's spare sandbox (made ahead of the next call, in its group)."""
    names = {os.path.basename(group) for group in groups}
    return len(names) <= keptgroups.KEEP + 1 and all(is_spare(int(pid)) for group in groups for pid in members(group).split())


def members(group: str) -> str:
    try:
        return Path(group, "cgroup.procs").read_text()
    except OSError:  # removed meanwhile: gone, or ENODEV while it is being removed
        return ""


def serve_pid(up: Up) -> int:
    return up.server.process.pid  # up runs serve in its own process


# -- the sandbox file, the flag, the argv ------------------------------------------


def test_the_limits_of_the_sandbox_file_are_checked_and_resolved_against_the_machine():
    parsed = sandboxfile.parse({"limits": {"memory": "25%", "tasks": 64, "cpu": "150%"}}, "f")
    host = sandbox.Host(bwrap="b", prlimit="p", disable_userns=True, root=(), nproc=1,
                        fsize_max=None, memory_total=8 * 1024 * MIB, cpus=4)
    assert sandbox.call_limits(parsed, host) == cgroups.Limits(2 * 1024 * MIB, 64, 150)
    assert sandbox.call_limits(sandboxfile.parse({"limits": {"memory": "4G"}}, "f"), host) == \
        cgroups.Limits(4 * 1024 * MIB, 1024, 300)  # the defaults: 1024 tasks, every core but one
    for bad in ({"memory": "0%"}, {"memory": "150%"}, {"memory": "lots"}, {"tasks": 3}, {"tasks": "many"},
                {"cpu": "2"}, {"cpu": "0%"}, {"cpu": 200}):
        with pytest.raises(LinkRunError, match=r"\[limits\]"):
            sandboxfile.parse({"limits": bad}, "f")
    for bad in ("lots", "150%"):  # both forms named, whichever was meant
        with pytest.raises(LinkRunError) as refused:
            sandboxfile.parse({"limits": {"memory": bad}}, "f")
        assert refused.value.hint == 'write a size such as "4G", or a share from "1%" to "100%"'


def test_serve_takes_its_limits_in_one_flag_and_names_a_bad_one():
    assert config.parse_limits("--limits", "memory=64M,tasks=32,cpu=50%") == cgroups.Limits(64 * MIB, 32, 50)
    assert config.parse_limits("--limits", "tasks=32") == cgroups.Limits(tasks=32)
    assert cgroups.Limits(64 * MIB, 32, 50).flag() == f"memory={64 * MIB},tasks=32,cpu=50%"
    for bad in ("memory=lots", "tasks=0", "cpu=200", "swap=1G", "tasks=1,tasks=2"):
        with pytest.raises(UsageError, match="--limits"):
            config.parse_limits("--limits", bad)


def test_a_limited_launch_is_born_in_its_group_and_a_launch_never_spawned_leaves_none():
    require_controllers("pids")
    box = Sandbox(("/usr/bin/env",), "/tmp", limits=cgroups.Limits(tasks=64))
    launch = prepare(box, ["/bin/cat", "/proc/self/cgroup"])
    group = launch.group
    assert all(os.path.isdir(folder) for folder in group.folders)
    assert launch.argv == ["/bin/cat", "/proc/self/cgroup"]  # a pass-through of env alone runs the program itself
    command = launch.command()
    if group.version == 2:  # spawned by Popen, a small sh joins it, then execs the sandbox
        assert command[:3] == ["/bin/sh", "-c", JOIN] and command[4:4 + len(group.procs)] == group.procs
    else:  # the spawning thread is in it for the spawn: no exec on the way
        assert command == launch.argv
    mine = Path("/proc/thread-self/cgroup").read_text()
    with launch.spawning():
        child = subprocess.run(command, capture_output=True, text=True, check=True)
    name = "/" + os.path.basename(group.folders[0])
    assert any(line.endswith(name) for line in child.stdout.splitlines())
    assert Path("/proc/thread-self/cgroup").read_text() == mine  # the spawning thread is back in its own
    launch.close()
    assert not any(os.path.exists(folder) for folder in group.folders)
    # A launch nobody waits on (an exec, the probe) has no group: nobody would remove it.
    assert prepare(box, ["/bin/true"], watch_init=False).group is None


# -- the limits, biting and not ------------------------------------------------------


def test_a_memory_hog_is_killed_at_its_limit_and_said(limited):
    require_controllers("memory")
    up = limited('memory = "64M"')
    result = up.command("python3", "-c", HOG, "256")  # four times the limit, and no more
    value = result["structuredContent"]
    assert value["limit"] == "memory", text_of(result)
    assert "allocated" not in value["output"]
    assert value["signal"] == "SIGKILL" or value["exit"] == 128 + signal.SIGKILL
    assert "[it reached its memory limit of 64M: the out-of-memory killer killed it]" in text_of(result)


def test_a_fork_flood_stops_at_its_task_limit_also_as_root(limited):
    require_controllers("pids")
    if not running_as_root():  # RLIMIT_NPROC binds nothing for root: the cgroup alone stops it
        pytest.skip("the task limit is shown where RLIMIT_NPROC binds nothing: as root")
    up = limited("tasks = 32")
    result = up.command("sh", "-c", FLOOD)
    value = result["structuredContent"]
    assert value["limit"] == "tasks", text_of(result)
    assert "[it reached its limit of 32 tasks: a fork or a new thread was refused]" in text_of(result)


def test_a_cpu_spinner_is_held_to_its_share(limited):
    require_controllers("cpu")
    up = limited('cpu = "20%"')
    result = up.command("python3", "-c", SPIN, "1.5")
    cpu, wall = map(float, result["structuredContent"]["output"].split())
    # 20% of one core over 1.5 s is 0.3 s; a spinner with a core to itself gets 1.5 s.
    assert cpu <= 0.2 * wall + 0.15, f"{cpu:.2f} s of CPU in {wall:.2f} s"
    assert result["structuredContent"]["limit"] is None


def test_calls_within_their_limits_are_unchanged_and_nothing_of_them_outlives_them(limited):
    require_controllers("memory", "pids", "cpu")
    up = limited('memory = "256M"\ntasks = 64\ncpu = "100%"')
    result = up.command("sh", "-c", "echo hello; python3 -c 'print(sum(range(10**6)))'; echo oops >&2; exit 3")
    value = result["structuredContent"]
    assert (value["exit"], value["output"], value["errors"], value["limit"]) == (3, "hello\n499999500000", "oops", None)
    tag = up.tag()
    left = up.command("sh", "-c", f"setsid {linger(tag)} & ({linger(tag)} &) ; echo left")
    assert left["structuredContent"]["output"] == "left"
    wait_for(lambda: not processes_with(tag), timeout=10, what="what the call left to die with it")
    pid = serve_pid(up)
    wait_for(lambda: only_kept_groups(groups_of(pid)), timeout=10, what="the calls' groups to be removed")
    up.server.process.stdin.close()  # serve's end: the group made ahead goes too
    assert up.server.process.wait(timeout=10) == 0
    assert not groups_of(pid)


def test_a_group_its_call_left_empty_serves_the_next_calls_and_counts_from_there(limited):
    """A group is kept for the next call, not removed and made again (a
    mkdir and an rmdir a call); a limit its last call hit is not the next's."""
    require_controllers("memory", "pids")
    up = limited('memory = "64M"\ntasks = 64')
    pid = serve_pid(up)
    hit = up.command("python3", "-c", HOG, "256")["structuredContent"]
    assert hit["limit"] == "memory"
    for _ in range(6):
        assert up.command("sh", "-c", "true")["structuredContent"]["limit"] is None
    wait_for(lambda: only_kept_groups(groups_of(pid)), timeout=10, what="the calls' groups to be kept empty")
    made = {int(os.path.basename(group).rsplit("-", 1)[1]) for group in groups_of(pid)}
    # The group of each call is named for the count made so far: at most the
    # spares kept, one call's and two being emptied; without keeping, each of
    # the 7 calls and each spare made for them would have made its own.
    assert max(made) <= AHEAD + 3, made


# -- background commands ---------------------------------------------------------------


def record_of(up: Up, command_id: str) -> dict:
    return orjson.loads((up.state / f"{command_id}.json").read_bytes())


def test_a_background_command_runs_in_its_group_and_its_record_list_and_told_message_say_what_bit(limited):
    require_controllers("memory", "pids")
    up = limited('memory = "64M"\ntasks = 32')
    tag = up.tag()
    running = up.start("sh", "-c", "sleep 300; :", tag)
    wait_for(lambda: record_of(up, running)["state"] == "running", timeout=30, what="the command to run")
    group = record_of(up, running)["cgroup"]
    wait_for(lambda: program_runs(tag), timeout=30, what="its program to start")
    members = cgroups.Group.of_record(group).members()
    assert set(processes_with(tag)) <= set(members)
    assert serve_pid(up) not in members and record_of(up, running)["leader_pid"] in members
    up.stop(running)
    wait_for(lambda: not processes_with(tag), timeout=10, what="stop to end the command")
    assert not any(os.path.exists(folder) for folder in group["folders"])

    hog = up.start("python3", "-c", HOG, "256")
    up.wait_ended(hog)
    entry = up.server.call("list", {}, meta=META)
    assert [e["limit"] for e in entry["structuredContent"]["commands"] if e["id"] == hog] == ["memory"]
    assert "killed at its memory limit" in text_of(entry)
    record = record_of(up, hog)
    assert record["limit"] == "memory" and record["limits"]["memory"] == 64 * MIB
    assert "it reached its memory limit, and the out-of-memory killer killed it" in told.told_text(record, b"")

    flood = up.start("sh", "-c", FLOOD)
    up.wait_ended(flood)
    assert record_of(up, flood)["limit"] == "tasks"


def test_a_sweep_ends_the_group_of_a_killed_supervisor_with_what_left_the_process_group(tmp_path):
    """Pass-through sandbox: no pid namespace, so only the group finds a process that left its process group."""
    require_controllers("pids")
    files = tmp_path / "files"
    (files / "work").mkdir(parents=True)
    state = tmp_path / "state"
    argv = serve_argv(files, "--limits", "tasks=64", "--state", str(state), "--no-way-in", "--background", "2",
                      "--background-timeout", "1h", "--background-output", "1M", "--background-keep", "1d",
                      "--background-per-day", "10", "--hops", "4", programs=("sh", "setsid", "sleep"),
                      sandbox=PASS_THROUGH)
    server = RawServer(argv, env=clean_env())
    tag = f"lnk-left-{secrets.token_hex(6)}"
    try:
        server.initialize()
        result = server.call("start", {"program": "sh", "args": ["-c", f"setsid {linger(tag)} & sleep 300"]},
                             meta=META)
        command_id = result["structuredContent"]["id"]
        record_file = state / f"{command_id}.json"
        wait_for(lambda: orjson.loads(record_file.read_bytes())["state"] == "running", what="the command to run")
        wait_for(lambda: len(processes_with(tag)) >= 2, timeout=30, what="the command to leave its process group")
        record = orjson.loads(record_file.read_bytes())
        supervisor = parent_of(record['leader_pid'])
        os.kill(supervisor, signal.SIGKILL)
        wait_for(lambda: "lost" in text_of(server.call("list", {}, meta=META)), timeout=30,
                 what="list to sweep the command lost")
        wait_for(lambda: not processes_with(tag), timeout=10, what="the sweep to end the command's group")
        assert not any(os.path.exists(folder) for folder in record["cgroup"]["folders"])
    finally:
        kill_tagged([tag])
        server.kill()
        stop_background(state)


def test_what_a_serve_killed_outright_left_in_a_calls_group_is_ended_by_the_next_serve(files):
    """serve's SIGKILL leaves a running call unwatched; its group names it, and the next serve ends it."""
    require_controllers("pids")
    argv = serve_argv(files, "--limits", "tasks=64", programs=("sh",), sandbox=PASS_THROUGH)
    tag = f"lnk-left-{secrets.token_hex(6)}"
    first = RawServer(argv, env=clean_env())
    try:
        first.initialize()
        first.send({"jsonrpc": "2.0", "id": 99, "method": "tools/call",
                    "params": {"name": "command", "arguments": {"program": "sh",
                                                                "args": ["-c", f"setsid {linger(tag)} & sleep 300"]}}})
        wait_for(lambda: len(processes_with(tag)) >= 2, timeout=30, what="the call to leave its process group")
        first.process.kill()
        first.kill()
        assert processes_with(tag), "the call outlived its serve, as it does without a group"
        second = RawServer(argv, env=clean_env())
        try:
            second.initialize()
            assert second.call("command", {"program": "sh", "args": ["-c", "exit 0"]})["structuredContent"]["exit"] == 0
            wait_for(lambda: not processes_with(tag), timeout=10, what="the next serve to end the orphaned group")
            assert not [g for g in groups_of(first.process.pid)]
        finally:
            second.kill()
    finally:
        kill_tagged([tag])


# -- an ordinary user, through a subtree handed to it ---------------------------------


def hand_over(place: cgroups.Place, user: pwd.struct_passwd) -> list[str]:
    """What systemd's delegation does: a group made by root in each hierarchy,
    owned by the user, with its cgroup.procs (and tasks) the user's to write."""
    name = f"lnk-test-delegated-{secrets.token_hex(4)}"
    folders = []
    for folder in dict.fromkeys(place.folders.values()):
        made = os.path.join(folder, name)
        os.mkdir(made)
        folders.append(made)
        for path in (made, os.path.join(made, "cgroup.procs"), os.path.join(made, "tasks")):
            if os.path.exists(path):
                os.chown(path, user.pw_uid, user.pw_gid)
    return folders


def test_an_ordinary_users_serve_limits_its_calls_through_a_subtree_handed_to_it(readable_runtime):
    where = require_controllers("memory", "pids", "cpu")
    if not running_as_root():
        pytest.skip("handing a subtree over needs root")
    tester = ensure_tester()
    delegated = hand_over(where, tester)
    workdir = Path(tempfile.mkdtemp(prefix="lnk-test-", dir=tester.pw_dir))
    up = None
    try:
        up = start_up("user", workdir, readable_runtime, limits_file("tasks = 32"),
                      join=tuple(os.path.join(f, "cgroup.procs") for f in delegated))
        result = up.command("sh", "-c", FLOOD)
        assert result["structuredContent"]["limit"] == "tasks", text_of(result)
        made = lambda: [os.path.join(f, name) for f in delegated for name in os.listdir(f)  # noqa: E731
                        if name.startswith("lnk-")]
        wait_for(lambda: only_kept_groups(made()), timeout=10, what="the call's group to go")
        assert os.stat(f"/proc/{up.server.process.pid}").st_uid == tester.pw_uid
        up.server.process.stdin.close()  # serve's end removes the group it made ahead, as the user too
        assert up.server.process.wait(timeout=10) == 0
        assert not made()
    finally:
        if up is not None:
            up.server.kill()
            stop_background(up.state)
        for folder in delegated:
            wait_for(lambda folder=folder: cgroups.Group(1, (folder,), cgroups.Limits()).remove(wait=0.5),
                     timeout=10, what="the handed-over group to be removed")
        subprocess.run(["rm", "-rf", str(workdir)], check=False)


# -- cgroup v2, as far as this machine goes ------------------------------------------


def test_a_v2_group_is_joined_killed_as_a_whole_and_removed():
    """Where v2 has no controllers (they are bound to v1), its groups still
    hold processes and `cgroup.kill` still ends them all: that much is run."""
    require_sandbox()
    v2, _ = cgroups.mounts()
    own, _ = cgroups.own_groups()
    if v2 is None or own is None or not os.access(os.path.normpath(v2 + own), os.W_OK):
        if os.environ.get("LNK_REQUIRE_SANDBOX") == "1" and running_as_root():
            pytest.fail("no writable cgroup v2 hierarchy as root")
        pytest.skip("no writable cgroup v2 hierarchy")
    folder = os.path.join(os.path.normpath(v2 + own), f"lnk-test-v2-{secrets.token_hex(4)}")
    os.mkdir(folder)
    group = cgroups.Group(2, (folder,), cgroups.Limits())
    tag = f"lnk-left-{secrets.token_hex(6)}"
    try:
        process = subprocess.Popen(["/bin/sh", "-c", JOIN, "sh", *group.procs, "--",
                                    "sh", "-c", f"setsid {linger(tag)} & {linger(tag)}"])
        wait_for(lambda: len(processes_with(tag)) >= 3, timeout=10, what="the shell and both lingerers")
        assert set(processes_with(tag)) <= set(group.members())
        group.kill()
        assert process.wait(timeout=10) == -signal.SIGKILL
        wait_for(lambda: not processes_with(tag), timeout=10, what="the whole group to die")
        assert group.limit_hit() is None
    finally:
        assert group.remove()
        kill_tagged([tag])
    assert not os.path.exists(folder)


CHECKS = ("from linkrun import doctor; from linkrun.sandboxing import cgroups; [print(l, w, '->', f) for l, w, f in "
          "doctor.limit_checks(cgroups.Limits(1 << 30, 64, 150), False, 'no bus', 120)]")


def test_doctor_says_which_limits_hold_and_for_an_ordinary_user_which_do_not_and_why(readable_runtime):
    require_controllers("memory", "pids", "cpu")
    done = subprocess.run([sys.executable, "-I", "-c", CHECKS], capture_output=True, text=True, check=True)
    version = cgroups.find().version
    assert done.stdout == f"ok per-call limits hold through cgroup v{version}: memory 1G, tasks 64, cpu 150% -> \n"
    if not running_as_root():
        return
    tester = ensure_tester()
    as_user = subprocess.run([str(readable_runtime / "venv" / "bin" / "python"), "-I", "-c", CHECKS],
                             capture_output=True, text=True, user=tester.pw_uid, group=tester.pw_gid,
                             extra_groups=[], cwd="/", env=clean_env(HOME=tester.pw_dir), check=True)
    lines = as_user.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "warn per-call memory limit 1G holds for each process alone, not for the call",
        "ok per-call tasks limit 64 holds for the call",
        "warn per-call cpu limit 1.5 cores' worth holds as CPU time for each process"]
    container = os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv")
    fix = "this is a container: run the agent on the host" if container else "session that starts systemd --user"
    assert all("writable only by root" in line for line in lines), lines
    assert all(fix in line for line in lines if line.startswith("warn")), lines


def test_the_instructions_say_the_limits_and_serve_names_each_limit_the_machine_cannot_hold(files):
    settings = config.parse_serve(["--files", str(files), "--programs-path", SYSTEM_PATH, "--timeout", "2m",
                                   "--output", "16K", "--program", "sh", "--write", "work",
                                   "--limits", "memory=64M,tasks=32,cpu=150%", "--", *PASS_THROUGH])
    from linkrun.calls import caller
    from linkrun.front import command_answer, offer

    from linkrun.sandboxing import fallback

    assert settings.limits is not None
    everywhere = cgroups.Place(version=1, folders={"memory": "/m", "pids": "/p", "cpu": "/c"}, missing={})
    held = fallback.holding(settings.limits, everywhere, 120)
    assert command_answer.limits_sentence(held) == (
        "Each call may use at most 64M of memory (past it the call is killed); 32 processes and threads at once "
        "(past them a fork fails); 1.5 cores' worth of CPU (past it the call is slowed). The answer says which "
        "limit bit.")
    offered = offer.Offer(settings)
    assert offered.sandbox.holding is not None
    assert command_answer.limits_sentence(offered.sandbox.holding) in offered.instructions()
    nowhere = cgroups.Place(version=0, folders={}, missing={"memory": "no delegation", "pids": "no delegation",
                                                            "cpu": "no delegation"})
    warnings = caller.limit_warnings(fallback.holding(settings.limits, nowhere, 120, euid=1000), nowhere)
    # tasks holds for the call through its rlimit, as doctor's "ok" says: nothing to mend, nothing said
    assert [w.split(" limit")[0] for w in warnings] == ["the per-call memory", "the per-call cpu"]
    assert all(f"(no delegation): run {invocation.typed('doctor')} for the fix" in w for w in warnings)
    as_root = caller.limit_warnings(fallback.holding(settings.limits, nowhere, 120, euid=0), nowhere)
    assert [w.split(" limit")[0] for w in as_root] == ["the per-call memory", "the per-call tasks",
                                                        "the per-call cpu"]  # root passes RLIMIT_NPROC
    assert caller.limit_warnings(held, everywhere) == []


def test_a_held_kernel_file_is_read_afresh_at_each_look_and_let_go_at_the_end(tmp_path) -> None:
    # A kept group's counters are read after each call through a descriptor
    # held from the first read (kernel.HeldFiles): each read must be the file
    # as it is now, not as it was when it was opened.
    from linkrun.kernel import HeldFiles

    child = subprocess.Popen(["sleep", "60"])
    held = HeldFiles()
    try:
        status = f"/proc/{child.pid}/status"
        wait_for(lambda: "State:\tS" in held.read(status), what="the child asleep")
        child.send_signal(signal.SIGSTOP)
        wait_for(lambda: "State:\tT" in held.read(status), what="the child seen stopped through the held file")
        assert held.read(str(tmp_path / "missing")) == ""
        (tmp_path / "missing").write_text("made since")
        assert held.read(str(tmp_path / "missing")) == ""  # a file missing at the first look is not looked for again
    finally:
        child.kill()
        child.wait()
        held.close()
    assert held.read(f"/proc/{os.getpid()}/status").startswith("Name:")  # a new look after close opens again
    held.close()


def test_a_kernel_file_held_before_its_first_read_stays_bound_to_its_process(tmp_path) -> None:
    # A spare's status files are opened as it is made and first read at its
    # take (kernel.HeldFiles.hold): the read is of that process, or nothing.
    from linkrun.kernel import HeldFiles

    child = subprocess.Popen(["sleep", "60"])
    held = HeldFiles()
    try:
        status = f"/proc/{child.pid}/status"
        held.hold(status)
        assert f"\nPid:\t{child.pid}\n" in held.read(status)
        child.kill()
        child.wait()
        assert held.read(status) == ""  # its process is gone: never another's given its pid
        later = tmp_path / "later"
        held.hold(str(later))
        later.write_text("made since")
        assert held.read(str(later)) == ""  # missing when held: not opened later
    finally:
        child.kill()
        child.wait()
        held.close()

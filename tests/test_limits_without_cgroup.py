"""Per-call limits where no cgroup can be had (DESIGN.md §6; docs/decisions.md,
"Limits without a cgroup"): an ordinary user without a delegated cgroup. What
can be held is held by rlimits set on the sandbox's init, and the
instructions, each answer's structured value and `doctor` say exactly which
limits hold and how. Real `up`, real bubblewrap, real programs.

As root the tests run the user's side as the ordinary user `lnk-tester`; the
launch-level tests run as root too, on a sandbox told that no cgroup can be
had (`Sandbox.place`), which is what an ordinary user's serve finds.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import orjson
import pytest
from conftest import clean_env, require_sandbox, text_of
from up_harness import META, Up, ensure_tester, running_as_root, start_up, stop_background, kill_tagged

from linkrun import agent, config
from linkrun.front import command_answer
from linkrun.messages import told
from linkrun.sandboxing import cgroups, fallback, sandbox, sandboxfile
from linkrun.processes.group import kill_init
from linkrun.sandboxing.launch import Sandbox, prepare

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
# Forks until a fork fails or 200 sleepers run, says how many, and ends them.
FLOOD = """
import os, time
kids = []
try:
    for _ in range(200):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        kids.append(pid)
finally:
    print("started", len(kids), flush=True)
    for pid in kids:
        os.kill(pid, 9)
"""
SPIN = "import time\nend = time.monotonic() + 90\nwhile time.monotonic() < end:\n    pass\nprint('spun')\n"
NOWHERE = cgroups.Place(version=0, folders={}, missing={c: "no delegated cgroup" for c in ("memory", "pids", "cpu")})


def limits_file(limits: str) -> str:
    return f'[commands]\nallow = ["sh", "python3", "cat", "sleep"]\n[limits]\n{limits}\n'


def no_cgroup_for_the_user() -> None:
    """Skip where the ordinary user has a cgroup (a systemd user session): these tests are for one without."""
    if not running_as_root() and cgroups.find().folders:
        pytest.skip("this user has a cgroup here: the limits hold through it")


@pytest.fixture
def as_user(tmp_path, request):
    """Start an `up` as the ordinary user with the [limits] given; everything of it ended at the end."""
    require_sandbox()
    no_cgroup_for_the_user()
    runtime = request.getfixturevalue("readable_runtime") if running_as_root() else None
    started: list[Up] = []

    def start(limits: str, spec: str = "") -> Up:
        if running_as_root():  # not under /tmp, and where the tester may write
            workdir = Path(tempfile.mkdtemp(prefix="lnk-test-", dir=ensure_tester().pw_dir))
        else:
            workdir = tmp_path / f"up{len(started)}"
            workdir.mkdir()
        if spec:  # the agent's own spec, kept in its folder as if an earlier up had kept it
            config = workdir / "agent" / "Config"
            config.mkdir(parents=True)
            (config / "spec.toml").write_text(spec)
            if running_as_root():
                tester = ensure_tester()
                for path in (workdir / "agent", config, config / "spec.toml"):
                    os.chown(path, tester.pw_uid, tester.pw_gid)
        up = start_up("user", workdir, runtime, limits_file(limits))
        started.append(up)
        return up

    yield start
    for up in started:
        kill_tagged(up.tags)
        up.server.close(timeout=15)
        stop_background(up.state)


def instructions_of(up: Up) -> str:
    return up.server.initialized["instructions"]


# -- what holds, in words -----------------------------------------------------------


def test_the_limits_held_are_told_apart_by_how_they_hold_here():
    limits = config.Limits(memory=256 * MIB, tasks=64, cpu=100)
    everywhere = cgroups.Place(version=2, folders={"memory": "/g", "pids": "/g", "cpu": "/g"}, missing={})
    held = fallback.holding(limits, everywhere, longest=120, euid=1000)
    assert (held.by_cgroup, held.by_rlimit, held.not_held) == (("memory", "tasks", "cpu"), (), ())
    as_user = fallback.holding(limits, NOWHERE, longest=120, euid=1000)
    assert (as_user.by_cgroup, as_user.by_rlimit, as_user.not_held) == ((), ("memory", "tasks", "cpu"), ())
    assert sorted(as_user.rlimits()) == sorted([(resource.RLIMIT_DATA, 256 * MIB, 256 * MIB),
                                                (resource.RLIMIT_NPROC, 64, 64),
                                                (resource.RLIMIT_CPU, 120, 121)])
    as_root = fallback.holding(limits, NOWHERE, longest=120, euid=0)
    assert as_root.not_held == ("tasks",)  # RLIMIT_NPROC binds nothing for root
    assert fallback.holding(limits, NOWHERE, longest=None, euid=1000).not_held == ("cpu",)


def test_sizes_and_shares_read_as_people_write_them():
    from linkrun.units import describe_size

    assert describe_size(6170916 * 1024) == "5.9G"
    assert describe_size(256 * MIB) == "256M"
    assert describe_size(16384) == "16K"
    assert describe_size(1000) == "1000 bytes"
    held = fallback.holding(config.Limits(cpu=100), cgroups.Place(2, {"cpu": "/g"}, {}), longest=120, euid=1000)
    assert "1 core's worth of CPU" in command_answer.limits_sentence(held)
    held = fallback.holding(config.Limits(cpu=150), cgroups.Place(2, {"cpu": "/g"}, {}), longest=120, euid=1000)
    assert "1.5 cores' worth of CPU" in command_answer.limits_sentence(held)


# -- a launch without a cgroup ---------------------------------------------------------

LIMITS = "grep -E '^Max (data size|processes|cpu time) ' /proc/self/limits"


def _launch_limits(tmp_path: Path, limits: config.Limits) -> dict[str, tuple[str, str]]:
    folder = agent.create(str(tmp_path / "agent"))
    fixed, _, _ = sandbox.build(folder, sandboxfile.load(None), clean_env())
    box = Sandbox(tuple(fixed), folder.files, ("work",), limits=limits, longest=120, place=NOWHERE)
    with prepare(box, ["/bin/sh", "-c", LIMITS]) as launch:
        assert launch.group is None  # no cgroup is made where none can be had
        process = subprocess.Popen(launch.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   pass_fds=launch.fds, env=launch.env, cwd=folder.files)
        init = launch.started()
        out, err = process.communicate(timeout=60)
        kill_init(init)
        if init is not None:
            os.close(init)
    assert process.returncode == 0, err
    return {" ".join(row.split()[1:-3]): tuple(row.split()[-3:-1]) for row in out.splitlines()}


def test_a_launch_without_a_cgroup_gives_its_program_the_limits_as_rlimits_as_root_and_as_a_user(tmp_path):
    require_sandbox()
    found = _launch_limits(tmp_path, config.Limits(memory=64 * MIB, tasks=48, cpu=50))
    assert found["data size"] == (str(64 * MIB), str(64 * MIB))
    if running_as_root():  # RLIMIT_NPROC binds nothing for root: the brake alone, as before
        assert found["processes"] != ("48", "48")
    else:
        assert found["processes"] == ("48", "48")
    assert found["cpu time"] == ("60", "61")  # half a core over the longest 120 s


# -- the user's `up` -------------------------------------------------------------------


def test_without_a_cgroup_a_memory_hog_fails_to_allocate_past_its_limit_and_the_answer_says_so(as_user):
    up = as_user('memory = "64M"')
    result = up.command("python3", "-c", HOG, "256")  # four times the limit, and no more
    value = result["structuredContent"]
    assert "allocated" not in value["output"], text_of(result)
    assert "MemoryError" in value["errors"]
    assert value["limit"] == "memory", text_of(result)
    assert value["limits"]["memory"] == {"at_most": 64 * MIB, "holds": "per process"}
    assert "[it likely reached its memory limit of 64M a process: an allocation failed" in text_of(result)


def test_without_a_cgroup_a_memory_hog_whose_errors_go_to_its_output_is_named_too(as_user):
    # `2>&1`, as agents often write it: the signs are in the output, the errors stream is empty.
    up = as_user('memory = "64M"')
    result = up.command("sh", "-c", 'exec python3 -c "$0" 256 2>&1', HOG)
    value = result["structuredContent"]
    assert "MemoryError" in value["output"] and not value["errors"], text_of(result)
    assert value["limit"] == "memory", text_of(result)
    assert "[it likely reached its memory limit of 64M a process: an allocation failed" in text_of(result)


def test_without_a_cgroup_a_background_memory_hog_is_named_in_list_and_its_message(as_user):
    # A background command's output is one stream, in a file: the signs are looked for in its end.
    up = as_user('memory = "64M"')
    hog = up.start("python3", "-c", HOG, "256")
    up.wait_ended(hog)
    listed = up.server.call("list", {}, meta=META)
    entry = next(e for e in listed["structuredContent"]["commands"] if e["id"] == hog)
    assert entry["limit"] == "memory", entry
    # Not killed, as a cgroup's out-of-memory killer would: its allocation was refused, and it ended itself.
    assert f"{hog} · exited (exit 1), an allocation refused at its memory limit" in text_of(listed)
    record = orjson.loads((up.state / f"{hog}.json").read_bytes())
    assert "exited with status 1; it likely reached its memory limit, and an allocation was refused" in \
        told.told_text(record, b"")


def test_without_a_cgroup_a_fork_flood_stops_at_its_task_limit_counted_in_its_own_namespace(as_user):
    up = as_user("tasks = 32")
    result = up.command("python3", "-c", FLOOD)
    value = result["structuredContent"]
    started = int(value["output"].split()[-1])
    # The user's own processes elsewhere (this test's, other agents') do not count: its namespace's do.
    assert 20 <= started < 32, text_of(result)
    assert value["limit"] == "tasks", text_of(result)
    assert value["limits"]["tasks"] == {"at_most": 32, "holds": "per call"}


THREADS = ("import threading, time\n"
           "for _ in range(100):\n    threading.Thread(target=time.sleep, args=(5,), daemon=True).start()")


def test_without_a_cgroup_a_thread_flood_at_its_task_limit_is_named_as_a_fork_flood_is(as_user):
    up = as_user("tasks = 32")
    result = up.command("python3", "-c", THREADS)
    value = result["structuredContent"]
    assert "can't start new thread" in value["errors"], text_of(result)
    assert value["limit"] == "tasks", text_of(result)


def test_without_a_cgroup_a_spinner_past_its_cpu_time_is_killed_and_the_answer_says_so(as_user):
    up = as_user('cpu = "1%"')  # 1% of a core over the longest call (2m): 2 s of CPU time a process
    result = up.command("python3", "-c", SPIN)
    value = result["structuredContent"]
    assert "spun" not in value["output"], text_of(result)
    assert value["limit"] == "cpu", text_of(result)
    assert value["limits"]["cpu"] == {"at_most": 1, "holds": "per process"}
    assert "[it reached its CPU time of 2 s a process: the kernel killed it with SIGXCPU]" in text_of(result)
    assert "(128+24: the program was killed by SIGXCPU)" in text_of(result)  # not "may have been": the limit says


def test_without_a_cgroup_a_background_spinner_past_its_cpu_time_is_killed_and_list_read_and_told_say_so(as_user):
    # 2% of a core over the longest background run (100 s): 2 s of CPU time a process.
    up = as_user('cpu = "2%"', spec='[tool.run]\nbackground_timeout = "100s"\n')
    spinner = up.start("python3", "-c", SPIN)
    up.wait_ended(spinner, timeout=90)
    listed = up.server.call("list", {}, meta=META)
    entry = next(e for e in listed["structuredContent"]["commands"] if e["id"] == spinner)
    assert entry["limit"] == "cpu" and entry["exit"] == 128 + signal.SIGXCPU, entry
    assert "killed at its CPU time (SIGXCPU)" in text_of(listed)
    _, text = up.read(spinner)
    assert f"{spinner} · exited (exit {128 + signal.SIGXCPU}), killed at its CPU time (SIGXCPU)" in text
    record = orjson.loads((up.state / f"{spinner}.json").read_bytes())
    assert "it used up its CPU time, and the kernel killed it with SIGXCPU" in told.told_text(record, b"")


def test_without_a_cgroup_the_instructions_promise_only_what_holds(as_user):
    up = as_user('memory = "256M"\ntasks = 64\ncpu = "100%"')
    instructions = instructions_of(up)
    assert "past its memory it is killed" not in instructions
    assert "at most 256M of memory in each process (past it an allocation fails" in instructions, instructions
    assert "64 processes and threads at once (past them a fork fails)" in instructions, instructions
    assert "120 s of CPU time in each process, 3600 s in a background command" in instructions, instructions
    result = up.command("sh", "-c", "echo hello")
    assert result["structuredContent"]["limit"] is None
    tools = up.server.request("tools/list", {}, timeout=60)["result"]["tools"]
    schema = next(tool["outputSchema"] for tool in tools if tool["name"] == "command")
    jsonschema.validate(result["structuredContent"], schema)  # `limits` is declared, as the clients check
    assert result["structuredContent"]["limits"] == {
        "memory": {"at_most": 256 * MIB, "holds": "per process"},
        "tasks": {"at_most": 64, "holds": "per call"},
        "cpu": {"at_most": 100, "holds": "per process"}}


CHECKS = ("from linkrun import doctor, config; [print(l, w, '->', f) for l, w, f in "
          "doctor.limit_checks(config.Limits(1 << 30, 64, 150), False, 'no bus', 120)]")


def test_doctor_says_how_each_limit_holds_for_a_user_without_a_cgroup(request):
    require_sandbox()
    no_cgroup_for_the_user()
    if running_as_root():
        tester = ensure_tester()
        runtime = request.getfixturevalue("readable_runtime")
        done = subprocess.run([str(runtime / "venv" / "bin" / "python"), "-I", "-c", CHECKS], capture_output=True,
                              text=True, user=tester.pw_uid, group=tester.pw_gid, extra_groups=[], cwd="/",
                              env=clean_env(HOME=tester.pw_dir))
    else:
        done = subprocess.run([sys.executable, "-I", "-c", CHECKS], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "warn per-call memory limit 1G holds for each process alone, not for the call",
        "ok per-call tasks limit 64 holds for the call",
        "warn per-call cpu limit 1.5 cores' worth holds as CPU time for each process"], lines
    assert all("->" in line for line in lines)


CLAMPED = """
import resource
from linkrun import config
from linkrun.sandboxing import cgroups, fallback
resource.setrlimit(resource.RLIMIT_DATA, (1 << 30, 1 << 30))
resource.setrlimit(resource.RLIMIT_CPU, (50, 50))
nowhere = cgroups.Place(0, {}, {})
held = fallback.holding(config.Limits(memory=4 << 30, tasks=64, cpu=100), nowhere, longest=120, euid=1000)
print(sorted(held.rlimits()))
"""


def test_an_rlimit_is_never_asked_above_the_hard_limit_this_user_has():
    # Raising a hard limit needs a privilege: asked for, every call would be refused.
    done = subprocess.run([sys.executable, "-I", "-c", CLAMPED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sorted([(resource.RLIMIT_DATA, 1 << 30, 1 << 30),
                                              (resource.RLIMIT_NPROC, 64, 64),
                                              (resource.RLIMIT_CPU, 50, 50)]))
    told_here = subprocess.run([sys.executable, "-I", "-c", CLAMPED.replace(
        "print(sorted(held.rlimits()))", "from linkrun.front import command_answer\n"
        "print(held.structured()['memory'], command_answer.limits_sentence(held))")],
        capture_output=True, text=True, timeout=60)
    assert f"{{'at_most': {1 << 30}, 'holds': 'per process'}}" in told_here.stdout, told_here.stdout
    assert "1G of memory in each process" in told_here.stdout and "50 s of CPU time" in told_here.stdout


def test_a_write_past_the_largest_file_is_named_as_the_file_limit_in_each_answer(as_user):
    # A new user's trial: `dd` past `[limits] file` ended with exit 153 and `limit: null`, and Python's
    # "File too large" with nothing at all: a structured-first model saw an exit and no reason.
    up = as_user('file = "1M"')
    note = "[it reached the largest file it may write (1M, the sandbox file's [limits] file)"
    for program, args in (("sh", ["-c", "head -c 2000000 /dev/zero > work/big"]),
                          ("python3", ["-c", "open('work/big', 'wb').write(bytes(2000000))"])):
        result = up.server.call("command", {"program": program, "args": args})
        value = result["structuredContent"]
        assert value["limit"] == "file" and value["exit"] != 0, text_of(result)
        assert text_of(result).count(note) == 1 and sum(note in line for line in value["notes"]) == 1, text_of(result)
    assert "exit 153 · " in text_of(result := up.server.call("command", {"program": "sh", "args": [
        "-c", "head -c 2000000 /dev/zero > work/big"]})) and "was killed by SIGXFSZ" in text_of(result), text_of(result)
    fits = up.server.call("command", {"program": "sh", "args": ["-c", "head -c 1000 /dev/zero > work/small; exit 3"]})
    assert fits["structuredContent"]["limit"] is None, text_of(fits)
    # An upload server's own words for its own limit are no sign of this one.
    upload = up.server.call("command", {"program": "sh", "args": ["-c", "echo 'MulterError: File too large' >&2; exit 1"]})
    assert upload["structuredContent"]["limit"] is None, text_of(upload)

    big = up.start("sh", "-c", "head -c 2000000 /dev/zero > work/big")
    up.wait_ended(big)
    listed = up.server.call("list", {}, meta=META)
    entry = next(e for e in listed["structuredContent"]["commands"] if e["id"] == big)
    assert entry["limit"] == "file", entry
    assert "a write refused past the largest file it may write ([limits] file)" in text_of(listed), text_of(listed)
    record = orjson.loads((up.state / f"{big}.json").read_bytes())
    assert "it reached the largest file it may write ([limits] file)" in told.told_text(record, b"")

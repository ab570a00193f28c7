"""A user's first hour (issue 22): `doctor` before and after the first `up`,
the sandbox file the first `up` writes, and what the commands say to a person.
Real `up`, real `doctor`, real bubblewrap, as root and as an ordinary user
(`lnk-tester` when the tests run as root)."""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import SERVER, clean_env, require_sandbox, text_of, wait_for
from sandbox_helpers import outer_sandbox
from up_harness import META, Up, ensure_tester, running_as_root

from linkrun.sandboxing import hostfacts, sandboxfile
from linkrun.state import records

Run = Callable[..., subprocess.CompletedProcess]

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(params=["root", "user"])
def who(request, tmp_path) -> Iterator[tuple[Run, Path]]:
    """`lnk-link-run ARGS` run as root, then as an ordinary user, and a folder of theirs to work in."""
    require_sandbox()
    if request.param == "root" and not running_as_root():
        pytest.skip("the root variant needs the tests to run as root")
    if request.param == "root" or not running_as_root():
        folder = tmp_path / "place"
        folder.mkdir()
        env = clean_env(HOME=str(folder), XDG_DATA_HOME=str(folder / "data"))

        def run(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
            return subprocess.run([*prefix, *SERVER, *args], capture_output=True, text=True, env=env, cwd=folder,
                                  timeout=120, stdin=subprocess.DEVNULL)

        yield run, folder
        return
    tester = ensure_tester()
    runtime = request.getfixturevalue("readable_runtime")
    folder = Path(tempfile.mkdtemp(prefix="lnk-test-", dir=tester.pw_dir))  # not under /tmp, and the tester's
    os.chown(folder, tester.pw_uid, tester.pw_gid)
    env = clean_env(HOME=tester.pw_dir, XDG_DATA_HOME=str(folder / "data"), USER=tester.pw_name,
                    LOGNAME=tester.pw_name)

    def run_as_tester(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        python = [str(runtime / "venv" / "bin" / "python"), "-I", "-m", "linkrun"]
        return subprocess.run([*prefix, *python, *args], capture_output=True, text=True, env=env, cwd=folder,
                              user=tester.pw_uid, group=tester.pw_gid, extra_groups=[], timeout=120,
                              stdin=subprocess.DEVNULL)

    yield run_as_tester, folder
    shutil.rmtree(folder, ignore_errors=True)


def lines_of(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stdout.splitlines() if not line.startswith("     → ")]


# -- doctor ------------------------------------------------------------------------------


def test_doctor_before_the_first_up_runs_every_check_up_runs_in_a_scratch_folder_and_leaves_nothing(who):
    run, folder = who
    agent = folder / "agents" / "first"
    done = run("doctor", "--agent", str(agent))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = lines_of(done)
    assert any(line.startswith(f"ok   the agent's folder {agent} does not exist yet") for line in lines), lines
    for check in ("ok   the sandbox starts", "ok   inside, the kernel's settings", "ok   programs offered: sh",
                  "the fork-bomb brake", "per-call"):
        assert any(check in line for line in lines), (check, lines)
    assert not agent.exists() and not agent.parent.exists()  # up makes it, never doctor
    assert not [name for name in os.listdir(folder) if name.startswith(".lnk-doctor-")]  # the scratch folder is gone


def test_doctor_before_the_first_up_fails_where_the_sandbox_cannot_start(tmp_path):
    require_sandbox()
    env = clean_env(HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path / "data"))
    refused = subprocess.run(outer_sandbox("--disable-userns") + SERVER + ["doctor"], env=env, capture_output=True,
                             text=True, timeout=120, cwd=tmp_path)
    assert refused.returncode == 1, refused.stdout
    assert "FAIL the kernel refused the sandbox its namespaces" in refused.stdout


def test_doctor_says_the_fork_bomb_brake_is_fine_for_an_ordinary_user_and_names_a_real_hard_limit(who):
    run, folder = who
    done = run("doctor", "--agent", str(folder / "agent"))
    brake = [line for line in lines_of(done) if "fork-bomb brake" in line or "hard limit" in line]
    assert len(brake) == 1, done.stdout
    if "running as root" in brake[0]:  # the root variant: the brake binds nothing for root, and says so
        return
    assert brake[0].startswith("ok   the fork-bomb brake"), brake
    # A hard limit on processes below the brake's margin: named as it is, not as the brake.
    count = hostfacts.count_tasks(os.stat(folder).st_uid)
    hard = count + 200
    low = run("doctor", "--agent", str(folder / "agent"), prefix=("prlimit", f"--nproc={hard}:{hard}", "--"))
    brake = [line for line in lines_of(low) if "hard limit" in line]
    assert len(brake) == 1 and brake[0].startswith("warn "), low.stdout
    assert f"its hard limit of {hard}" in brake[0], brake


# -- the sandbox file ---------------------------------------------------------------------


def test_the_first_up_writes_the_sandbox_file_in_force_and_adding_a_program_to_it_keeps_the_others(who):
    run, folder = who
    agent = folder / "agent"
    first = run("up", "--agent", str(agent), "--no-way-in")  # its input is empty: it serves nothing and ends
    assert first.returncode == 0, first.stderr
    written = agent / "Config" / "sandbox.toml"
    text = written.read_text()
    assert text.startswith("#") and "[commands]" in text and "[limits]" in text, text
    assert sandboxfile.load(str(written)) == sandboxfile.load(None)._replace(source=str(written))
    # A third new user's trial: a comment named `[limits] cpu_spare_cores`, which the file refuses as unknown.
    named = re.findall(r"\[(\w+)\] (\w+)", "\n".join(line.partition("#")[2] for line in text.splitlines()))
    assert all(key in sandboxfile.KEYS.get(section, ()) for section, key in named), named
    assert "cpu_spare_cores" not in text, text
    # The docs' advice: add the program to [commands] allow.
    written.write_text(text.replace('"sh", "bash",', '"sh", "id", "bash",', 1))
    done = run("doctor", "--agent", str(agent))
    offered = next(line for line in done.stdout.splitlines() if "programs offered:" in line)
    assert "sh, id, bash, python3" in offered, offered
    again = run("up", "--agent", str(agent), "--no-way-in")
    assert again.returncode == 0, again.stderr
    assert "id" in written.read_text().split("allow")[1].split("]")[0]  # a second up keeps the user's file


# -- what the commands say to a person ------------------------------------------------------


def first_line(fd: int, timeout: float) -> str:
    """The first line written to the pipe `fd`, read as it comes, within `timeout` seconds ("" at the deadline)."""
    data = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in data and select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").split("\n")[0]


def test_up_started_in_a_terminal_says_it_waits_for_an_mcp_client_and_where_its_setup_is(tmp_path):
    require_sandbox()
    env = clean_env(HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path / "data"))
    agent = tmp_path / "agent"
    controller, terminal = os.openpty()
    try:
        up = subprocess.Popen([*SERVER, "up", "--agent", str(agent)], stdin=terminal, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    finally:
        os.close(terminal)
    try:
        assert up.stderr is not None
        first = first_line(up.stderr.fileno(), timeout=60)  # said before it waits
        assert "an MCP server over stdio" in first and "waiting for a client" in first, first
        assert str(agent) in first and str(agent / "Config" / "sandbox.toml") in first, first
    finally:
        os.close(controller)  # the terminal hangs up: its input ends
        up.communicate(timeout=60)
    piped = subprocess.run([*SERVER, "up", "--agent", str(agent)], stdin=subprocess.DEVNULL, capture_output=True,
                           env=env, cwd=tmp_path, timeout=120)
    assert b"waiting for a client" not in piped.stderr  # a client's pipe: nothing but the protocol


def test_up_help_explains_each_flag_with_its_default():
    done = subprocess.run([*SERVER, "up", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    for flag in ("--agent DIR", "--sandbox FILE", "--spec FILE", "--no-way-in", "--way-in ADDR", "--as ID",
                 "--keyring DIR", "--route PROXY"):
        row = next((line for line in lines if line.strip().startswith(flag)), None)
        assert row is not None and len(row.split(flag, 1)[1].strip()) > 20, (flag, done.stdout)
    text = " ".join(done.stdout.split())
    assert "default: $XDG_DATA_HOME/linkrun/agents/main" in text
    assert "timeout 2m" in text and "output 16K" in text  # the spec's defaults, from the embedded ones
    assert "MCP client" in text
    assert "background commands (start, list, read, write, stop)" in text  # the tools --no-way-in adds


def test_sandbox_help_shows_its_file_and_agent_as_the_defaults_they_have():
    done = subprocess.run([*SERVER, "sandbox", "--help"], capture_output=True, text=True, timeout=60)
    assert "lnk-link-run sandbox [--file <sandbox.toml>] [--agent <dir>] [--print] -- <program> <args>" in done.stdout


def test_stop_remove_and_sweep_given_the_agents_folder_or_a_missing_folder_say_so_and_touch_nothing(who):
    run, folder = who
    agent = folder / "agent"
    assert run("up", "--agent", str(agent), "--no-way-in").returncode == 0  # makes the agent's folder
    lost = run("sweep", str(folder / "nonexistent"))  # its folder as a word, as the usage gives it
    assert lost.returncode == 1 and "no such folder" in lost.stderr, lost.stderr
    for command in ("stop", "remove", "sweep"):
        wrong = run(command, "--state", str(agent))
        assert wrong.returncode == 1, wrong.stderr
        assert f"{agent} is an agent's folder, not its state folder" in wrong.stderr, wrong.stderr
        assert f"--state {agent / 'State'}" in wrong.stderr
        missing = run(command, "--state", str(folder / "nonexistent" / "State"))
        assert missing.returncode == 1 and "no such folder" in missing.stderr, missing.stderr
    assert (agent / "Files" / "work").is_dir() and (agent / "State").is_dir()  # nothing of it removed
    assert run("stop", "--state", str(agent / "State")).returncode == 0
    assert run("remove", "--state", str(agent / "State")).returncode == 0
    again = run("remove", "--state", str(agent / "State"))  # twice is safe: removed already
    assert again.returncode == 0, again.stderr
    assert not (agent / "State").exists() and (agent / "Files").is_dir()


def test_stop_and_remove_take_the_agents_folder_as_up_does_and_given_neither_name_both(who):
    run, folder = who
    agent = folder / "agent"
    assert run("up", "--agent", str(agent), "--no-way-in").returncode == 0  # makes the agent's folder
    neither = run("remove")  # it deletes: the agent is named, never assumed
    assert neither.returncode == 2, neither.stderr
    assert "--agent <folder>" in neither.stderr and "--state <dir>" in neither.stderr, neither.stderr
    # A new user's trial: stop needed --agent even for the agent up and doctor take by default.
    nothing = run("stop")  # no default agent made yet: nothing of it runs
    default = folder / "data" / "linkrun" / "agents" / "main"
    assert nothing.returncode == 0, nothing.stderr
    assert f"no state folder in the default agent's folder {default}: no background command of it runs" in \
        nothing.stderr and "--agent names another agent" in nothing.stderr, nothing.stderr
    assert run("up", "--no-way-in").returncode == 0  # the default agent
    by_default = run("stop")
    assert by_default.returncode == 0, by_default.stderr
    assert f"stopped 0 background command(s) of {default};" in by_default.stderr, by_default.stderr
    for command in ("stop", "remove"):
        both = run(command, "--agent", str(agent), "--state", str(agent / "State"))
        assert both.returncode == 2 and "give one" in both.stderr, both.stderr
        not_an_agent = run(command, "--agent", str(agent / "State"))  # its state folder, given as the agent's
        assert not_an_agent.returncode == 1, not_an_agent.stderr
        assert f"{agent / 'State'} is not an agent's folder" in not_an_agent.stderr, not_an_agent.stderr
        assert f"--agent {agent}" in not_an_agent.stderr, not_an_agent.stderr
        missing = run(command, "--agent", str(folder / "nonexistent"))
        assert missing.returncode == 1 and "no such folder" in missing.stderr, missing.stderr
    stopped = run("stop", "--agent", str(agent))
    assert stopped.returncode == 0 and "stopped 0 background command(s)" in stopped.stderr, stopped.stderr
    assert run("remove", "--agent", str(agent)).returncode == 0
    assert not (agent / "State").exists() and (agent / "Files" / "work").is_dir()  # its state alone
    again = run("remove", "--agent", str(agent))  # twice is safe: removed already
    assert again.returncode == 0, again.stderr


def run_as_owner(up: Up, request: pytest.FixtureRequest, *args: str) -> subprocess.CompletedProcess:
    """`lnk-link-run ARGS` as the user whose `up` it is (the ordinary user's from the readable venv, as root)."""
    if up.who == "user" and running_as_root():
        tester = ensure_tester()
        python = [str(request.getfixturevalue("readable_runtime") / "venv" / "bin" / "python"), "-I", "-m", "linkrun"]
        return subprocess.run([*python, *args], capture_output=True, text=True, env=clean_env(), cwd="/",
                              user=tester.pw_uid, group=tester.pw_gid, extra_groups=[], timeout=120)
    return subprocess.run([*SERVER, *args], capture_output=True, text=True, env=clean_env(), timeout=120)


def test_stop_given_the_agents_folder_stops_the_background_commands_that_outlive_the_client(up_as, request):
    command_id = up_as.start("python3", "-c", "import time; time.sleep(1000)")
    wait_for(lambda: (records.load(str(up_as.state), command_id) or {}).get("state") == "running",
             timeout=30, what="the background command to run")
    up_as.server.close(timeout=15)  # the client gone: its background command runs on
    assert records.is_held(str(up_as.state), command_id)
    done = run_as_owner(up_as, request, "stop", "--agent", str(up_as.agent))
    assert done.returncode == 0, done.stderr
    assert "stopped 1 background command(s)" in done.stderr, done.stderr
    assert records.load(str(up_as.state), command_id)["state"] == "lost"
    assert not records.is_held(str(up_as.state), command_id)


def test_remove_beside_a_running_serve_says_what_it_removed_and_that_serve_says_its_state_is_gone(up_as, request):
    # A new user's trial: `remove` printed nothing, and each call of the serve still running then
    # failed with "[Errno 2] ... State/etc.view. Try again", which never mended it.
    command_id = up_as.start("python3", "-c", "import time; time.sleep(1000)")
    wait_for(lambda: (records.load(str(up_as.state), command_id) or {}).get("state") == "running",
             timeout=30, what="the background command to run")
    done = run_as_owner(up_as, request, "remove", "--agent", str(up_as.agent))
    assert done.returncode == 0, done.stderr
    assert f"removed {up_as.state}: stopped 1 background command(s), removed the records of 1 with their output" \
        in done.stderr, done.stderr
    assert not up_as.state.exists()
    # The first call makes its kept output's folder again (State/kept/): each call still says the state is gone.
    for name, arguments in (("command", {"program": "sh", "args": ["-c", "echo hi"]}),
                            ("start", {"program": "sh", "args": ["-c", "echo hi"]})):
        result = up_as.server.call(name, arguments, meta=META, timeout=60)
        assert result.get("isError"), result
        text = text_of(result)
        assert f"the agent's state folder {up_as.state} is gone: `lnk-link-run remove` removed it" in text, text
        assert "start the agent again" in text and "Try again" not in text, text


def test_a_call_refused_by_a_server_that_start_runs_is_told_why(up_as):
    # A fourth new user's trial: a test in a later command could not reach the server `start` ran, and its
    # "Connection refused" came with no word of each sandbox's network being its own.
    fetch = "import urllib.request, sys; print(urllib.request.urlopen(sys.argv[1]).status)"
    server = up_as.start("python3", "-m", "http.server", "8765", "--bind", "127.0.0.1")
    found = up_as.server.call("read", {"id": server, "pattern": "Serving", "wait": 20}, meta=META, timeout=60)
    assert found["structuredContent"]["until"] == "match", text_of(found)
    result = up_as.server.call("command", {"program": "python3", "args": ["-c", fetch, "http://127.0.0.1:8765/"]},
                               meta=META, timeout=60)
    assert "Connection refused" in text_of(result), text_of(result)
    note = f"[a server that start runs ({server}) is in a sandbox of its own, with a network of its own"
    assert note in text_of(result) and any(note in n for n in result["structuredContent"]["notes"]), text_of(result)
    together = up_as.server.call("command", {"program": "sh", "args": ["-c", (
        f"python3 -m http.server 8766 --bind 127.0.0.1 & sleep 1; python3 -c '{fetch}' http://127.0.0.1:8766/; "
        "kill $!")]}, meta=META, timeout=60)
    assert "200" in text_of(together) and "notes" not in together["structuredContent"], text_of(together)
    up_as.server.call("stop", {"id": server}, meta=META, timeout=60)
    alone = up_as.server.call("command", {"program": "python3", "args": ["-c", fetch, "http://127.0.0.1:8765/"]},
                              meta=META, timeout=60)  # nothing of this conversation runs: nothing to say
    assert "Connection refused" in text_of(alone) and "notes" not in alone["structuredContent"], text_of(alone)


def test_read_of_an_ended_background_command_says_how_it_ended(up_as):
    command_id = up_as.start("sh", "-c", "echo done; exit 3")
    up_as.wait_ended(command_id)
    value, text = up_as.read(command_id)
    header = text.splitlines()[0]
    assert header.startswith(f"{command_id} · exited (exit 3) · bytes 0–5 of 5"), header
    assert value["state"] == "exited"


def test_a_call_without_a_program_says_it_is_missing(up_as):
    result = up_as.server.call("command", {"args": ["x"]}, timeout=60)
    assert result.get("isError"), result
    assert text_of(result).startswith("Refused: program is missing;"), text_of(result)


def test_doctor_before_the_first_up_fails_where_the_agents_folder_cannot_be_made(who):
    run, folder = who
    if os.access("/", os.W_OK) and os.stat(folder).st_uid == os.geteuid():
        pytest.skip("whoever may write / may make the agent's folder anywhere: the user variant shows it")
    done = run("doctor", "--agent", "/lnk-no-such-place/agent")
    assert done.returncode == 1, done.stdout
    assert "FAIL the agent's folder /lnk-no-such-place/agent cannot be made: / may not be written" in done.stdout


def test_doctor_in_an_agents_folder_made_read_only_names_what_it_cannot_write(who):
    run, folder = who
    agent = folder / "agent"
    assert run("up", "--agent", str(agent), "--no-way-in").returncode == 0
    if os.access("/", os.W_OK) and os.stat(folder).st_uid == os.geteuid():
        pytest.skip("whoever may write / writes a read-only folder too: the user variant shows it")
    paths = [agent, *(path for path in agent.rglob("*") if not path.is_symlink())]  # as chmod -R a-w
    for path in paths:
        path.chmod(path.stat().st_mode & ~0o222)
    try:
        done = run("doctor", "--agent", str(agent))
    finally:
        for path in paths:
            path.chmod(path.stat().st_mode | 0o200)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert f"FAIL cannot write the agent's state folder {agent / 'State'}" in done.stdout, done.stdout


def test_up_whose_agents_folder_cannot_be_made_says_why_and_what_to_do(who):
    """A folder where the agent's cannot be made (below a file; below / for a
    user) is one line naming it, the reason and the fix, never a traceback."""
    run, folder = who
    (folder / "a-file").write_text("")
    places = [folder / "a-file" / "agent"]
    if not (os.access("/", os.W_OK) and os.stat(folder).st_uid == os.geteuid()):
        places.append(Path("/lnk-no-such-place/agent"))  # the user variant: / may not be written
    for place in places:
        done = run("up", "--agent", str(place), "--no-way-in")
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        assert f"the agent's folder {place} cannot be made" in done.stderr, done.stderr
        assert "give --agent a folder you may write" in done.stderr, done.stderr


def test_doctor_names_a_spec_that_up_cannot_follow(tmp_path):
    # A new user's trial: `timeout = "five"` in Config/spec.toml ended up at once, and doctor said all was well.
    agent = tmp_path / "agent"
    (agent / "Config").mkdir(parents=True)
    (agent / "Config" / "spec.toml").write_text('[tool.run]\ntimeout = "five"\n')
    done = subprocess.run(SERVER + ["doctor", "--agent", str(agent)], env=clean_env(HOME=str(tmp_path)),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert failed and failed[0].startswith(f"FAIL the spec: {agent}/Config/spec.toml: [tool.run] timeout 'five'"), \
        done.stdout


def test_doctor_and_up_say_a_spec_without_a_run_table_sets_nothing(tmp_path, servers):
    # A third new user's trial: `[run]` for `[tool.run]` was read as no numbers at all, and doctor said "ok".
    agent = tmp_path / "agent"
    (agent / "Config").mkdir(parents=True)
    (agent / "Config" / "spec.toml").write_text("[run]\ntimeout = 30\n")
    env = clean_env(HOME=str(tmp_path))
    done = subprocess.run(SERVER + ["doctor", "--agent", str(agent)], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    said = f"the spec {agent}/Config/spec.toml has no [tool.run] table: its numbers are the embedded defaults"
    assert f"warn {said}" in done.stdout, done.stdout
    assert "ok the spec" not in done.stdout, done.stdout
    server = servers(SERVER + ["up", "--agent", str(agent)], env=env)
    server.initialize()
    assert server.close() == 0
    assert said in server.stderr.decode(), server.stderr
    given = tmp_path / "spec.toml"  # and a spec given to up, as a new user first gives one
    given.write_text("[run]\ntimeout = 30\n")
    server = servers(SERVER + ["up", "--agent", str(agent), "--spec", str(given)], env=env)
    server.initialize()
    assert server.close() == 0
    assert f"the spec {given} has no [tool.run] table" in server.stderr.decode(), server.stderr


def test_a_write_folder_the_files_folder_lacks_is_said_by_doctor_and_up(tmp_path, servers):
    # A third new user's trial: `write = ["dta"]` for "data" gave a new, empty writable folder, and nothing said so.
    agent = tmp_path / "agent"
    env = clean_env(HOME=str(tmp_path))
    assert subprocess.run(SERVER + ["up", "--agent", str(agent)], env=env, capture_output=True, timeout=120,
                          stdin=subprocess.DEVNULL).returncode == 0
    (agent / "Files" / "data").mkdir()
    kept = agent / "Config" / "sandbox.toml"
    kept.write_text(kept.read_text().replace('write = []', 'write = ["data", "dta"]'))
    said = f"[files] write names dta/, which the files folder {agent / 'Files'} lacks: each call makes it, empty"
    server = servers(SERVER + ["up", "--agent", str(agent)], env=env)
    server.initialize()
    assert server.close() == 0
    assert said in server.stderr.decode() and f"mend it in {kept}" in server.stderr.decode(), server.stderr
    # up's check of the sandbox makes it, as each call does (and doctor's): then doctor names it among the folders, empty.
    server = servers(SERVER + ["up", "--agent", str(agent)], env=env)
    server.initialize()
    server.call("command", {"program": "sh", "args": ["-c", "touch data/x"]})
    assert server.close() == 0
    done = subprocess.run(SERVER + ["doctor", "--agent", str(agent)], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert "the folders calls may write: work/ (empty), data/, dta/ (empty)" in done.stdout, done.stdout
    shutil.rmtree(agent / "Files" / "dta")
    done = subprocess.run(SERVER + ["doctor", "--agent", str(agent)], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert f"warn {said}" in done.stdout and "data/," not in done.stdout, done.stdout

"""A user's first hour (issue 22): `doctor` before and after the first `up`,
the sandbox file the first `up` writes, and what the commands say to a person.
Real `up`, real `doctor`, real bubblewrap, as root and as an ordinary user
(`lnk-tester` when the tests run as root)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import SERVER, clean_env, require_sandbox
from sandbox_helpers import outer_sandbox
from up_harness import ensure_tester, running_as_root

from linkrun.sandboxing import hostfacts, sandbox

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
    assert sandbox.load(str(written)) == dataclasses.replace(sandbox.load(None), source=str(written))
    # The docs' advice: add the program to [commands] allow.
    written.write_text(text.replace('"sh", "bash",', '"sh", "id", "bash",', 1))
    done = run("doctor", "--agent", str(agent))
    offered = next(line for line in done.stdout.splitlines() if "programs offered:" in line)
    assert "sh, id, bash, python3" in offered, offered
    again = run("up", "--agent", str(agent), "--no-way-in")
    assert again.returncode == 0, again.stderr
    assert "id" in written.read_text().split("allow")[1].split("]")[0]  # a second up keeps the user's file

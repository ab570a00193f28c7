"""An install as users make it: the wheel, installed (not editable) in a venv
of its own, gives an `lnk-link-run` whose `up` serves a sandboxed call and
whose `doctor` runs; and a message that says to run a command names one that
is there.

The wheel is built without the internet (`--no-build-isolation`, with the
setuptools of the test venv) from a copy of what a build reads, so that no
build folder is left in the tree. The venv it goes into has no pip and no
libraries: pip is run from outside it (`pip --python`), and a `.pth` lends it
the test venv's libraries (orjson, watchdog), which come after its own
site-packages, so that `linkrun` is the installed one; a `.pth` line adds a
folder, and the editable install's own `.pth` there is never read.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, SYSTEM_PATH, clean_env, require_sandbox, text_of

# What a build reads: the project's metadata, its readme, and the package.
BUILD_INPUTS = ("pyproject.toml", "README.md", "linkrun")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built once per test process."""
    top = tmp_path_factory.mktemp("build")
    source = top / "source"
    source.mkdir()
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(REPO / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "--disable-pip-version-check", "-q", "-w", str(top / "dist"), str(source)],
                           capture_output=True, text=True, timeout=240)
    assert built.returncode == 0, built.stderr
    (found,) = (top / "dist").glob("linkrun-*.whl")
    return found


@pytest.fixture(scope="session")
def installed(wheel, tmp_path_factory) -> Path:
    """A venv of its own holding the wheel, as pip, pipx or uv tool would make it: its folder."""
    root = tmp_path_factory.mktemp("installed") / "venv"
    venv.EnvBuilder(with_pip=False).create(root)
    python = root / "bin" / "python"
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                           "--disable-pip-version-check", "-q", str(wheel)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    site = subprocess.run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    Path(site, "lnk-test-libraries.pth").write_text("".join(f"{folder}\n" for folder in sorted(ours)))
    return root


def package_files(root: Path) -> set[str]:
    """Every file of the package under root, relative to root, but compiled ones."""
    return {str(path.relative_to(root)) for path in (root / "linkrun").rglob("*")
            if path.is_file() and "__pycache__" not in path.parts}


def test_the_wheel_holds_every_module_and_data_file_of_the_package(wheel):
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.startswith("linkrun/")}
    source = package_files(REPO)
    assert source - shipped == set(), f"left out of the wheel: {sorted(source - shipped)}"
    assert {"linkrun/defaults.toml", "linkrun/sandboxing/launch.py", "linkrun/network/handover.py"} <= shipped


@pytest.mark.sandbox
def test_the_installed_command_serves_a_sandboxed_call_and_its_doctor_runs(installed, tmp_path, servers):
    require_sandbox()
    python = installed / "bin" / "python"
    where = subprocess.run([str(python), "-I", "-c", "import linkrun; print(linkrun.__file__)"],
                           capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert Path(where).is_relative_to(installed), f"the venv's linkrun is {where}, not the installed one"
    agent = tmp_path / "agent"
    env = clean_env(HOME=str(tmp_path), PATH=f"{installed / 'bin'}:{SYSTEM_PATH}")
    server = servers(["lnk-link-run", "up", "--agent", str(agent), "--no-way-in"], env=env)
    try:
        server.initialize()
    except Exception:
        server.kill()
        raise AssertionError(f"the installed up did not start: {server.stderr.decode(errors='replace')}") from None
    names = [tool["name"] for tool in server.request("tools/list")["result"]["tools"]]
    assert names == ["command", "start", "list", "read", "write", "stop"]
    result = server.call("command", {"program": "sh", "args": [
        "-c", "pwd; echo hi > work/hi && cat work/hi; (: > x) 2>/dev/null || echo read-only"]}, timeout=60)
    assert not result.get("isError") and result["structuredContent"]["exit"] == 0, text_of(result)
    assert result["structuredContent"]["output"].split("\n")[:3] == [str(agent / "Files"), "hi", "read-only"]
    assert server.close(timeout=15) == 0
    # The README's other command, as typed, on the PATH the install gives.
    doctor = subprocess.run(["lnk-link-run", "doctor", "--agent", str(agent)], env=env, capture_output=True,
                            text=True, timeout=120)
    assert doctor.returncode == 0 and "ok   the sandbox starts" in doctor.stdout, doctor.stdout + doctor.stderr


def test_a_message_names_the_command_as_the_users_path_finds_it_or_by_its_full_path(installed, tmp_path):
    bin_folder = installed / "bin"
    ours = bin_folder / "lnk-link-run"

    def told(path: str) -> str:
        code = "from linkrun import invocation; print(invocation.typed('doctor'))"
        return subprocess.run([str(bin_folder / "python"), "-I", "-c", code], env={"PATH": path},
                              capture_output=True, text=True, check=True, timeout=60).stdout.strip()

    assert told(f"{bin_folder}:{SYSTEM_PATH}") == "lnk-link-run doctor"
    linked = tmp_path / "local-bin"  # pipx and uv tool link their venv's command from a folder on the PATH
    linked.mkdir()
    (linked / "lnk-link-run").symlink_to(ours)
    assert told(f"{linked}:{SYSTEM_PATH}") == "lnk-link-run doctor"
    # Not on the PATH (a clone's tools/setup), or another install found first: ours, by its full path.
    assert told(SYSTEM_PATH) == f"{ours} doctor"
    other = tmp_path / "other-bin"
    other.mkdir()
    (other / "lnk-link-run").write_text("#!/bin/sh\nexit 1\n")
    (other / "lnk-link-run").chmod(0o755)
    assert told(f"{other}:{bin_folder}:{SYSTEM_PATH}") == f"{ours} doctor"
    version = subprocess.run([str(ours), "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout == "lnk-link-run 0.1.0\n"

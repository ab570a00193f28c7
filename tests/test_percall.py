"""The per-call part of the sandbox (DESIGN.md §6): write folders, bound
through descriptors opened without following a link. First the two escapes
review found: a link planted by one call must never make a read-only path
writable, or bind a host folder in, at the next. (Repositories are no longer
bound over: the git check, tests/test_gitguard.py, sets aside what a program
wrote into them; the tests of their links stay here.)
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pytest
from conftest import require_sandbox
from percall_helpers import call_part, close_all, open_files, refused
from sandbox_helpers import Agent

from linkrun.sandboxing import gitcheck, percall


@pytest.fixture
def files(tmp_path) -> Path:
    folder = tmp_path / "agent" / "Files"
    (folder / "work").mkdir(parents=True)
    (tmp_path / "agent" / "Home").mkdir()
    (tmp_path / "agent" / "State").mkdir()
    return folder


# The escapes.

def test_a_link_planted_on_a_write_folder_cannot_make_home_writable_at_the_next_call(files):
    os.symlink("../../Home", files / "work" / "cache")
    error = refused(files, ["work", "work/cache"])
    assert error.path == "work/cache"
    assert "work/cache in the files folder is a link (to '../../Home')" in str(error)
    assert "remove it" in str(error)


def look_at(files: Path) -> gitcheck.GitLook:
    fd = open_files(files)
    try:
        return gitcheck.look(fd, str(files), ["work"])
    finally:
        os.close(fd)


def test_a_link_planted_as_git_hooks_binds_nothing_and_is_set_aside(files):
    git = files / "work" / "repo" / ".git"
    git.mkdir(parents=True)
    (git / "config").write_text("[core]\n")
    look = look_at(files)
    os.symlink("../../../..", git / "hooks")
    part, fds = call_part(files)
    close_all(fds)
    assert part[:3] == ["--bind-fd", str(fds[0]), f"{files}/work"] and len(fds) == 1
    assert gitcheck.after(look)[0].startswith("work/repo/.git/hooks: set aside as hooks.lnk-set-aside-")
    assert not os.path.lexists(git / "hooks")


def test_both_escapes_are_refused_by_the_real_sandbox_and_nothing_runs(tmp_path):
    require_sandbox()
    box = Agent(tmp_path, '[files]\nwrite = ["work/cache"]\n')
    os.symlink("../../Home", box.files / "work" / "cache")
    done = box.sh("echo pwned > work/cache/note")
    assert done.returncode != 0
    assert "work/cache in the files folder is a link" in done.stderr
    assert (box.root / "Home" / "note").read_text() == "home note\n"

    os.unlink(box.files / "work" / "cache")
    git = box.files / "work" / "repo" / ".git"
    git.mkdir(parents=True)
    os.symlink("../../../..", git / "hooks")
    done = box.sh("ls work/repo/.git/hooks/State")  # no bind follows it: inside, it names what the sandbox shows
    assert done.returncode != 0 and "No such file" in done.stderr
    assert "record.json" not in done.stdout


def test_a_link_planted_as_git_or_as_git_config_is_set_aside(files):
    (files / "work" / "a").mkdir()
    git = files / "work" / "a" / "b" / ".git"
    git.mkdir(parents=True)
    look = look_at(files)
    os.symlink("../../../Home", files / "work" / "a" / ".git")
    os.symlink("../../../../../State/x", git / "config")
    assert sorted(note.split(":")[0] for note in gitcheck.after(look)) == ["work/a/.git", "work/a/b/.git/config"]
    assert not os.path.lexists(files / "work" / "a" / ".git") and not os.path.lexists(git / "config")


def test_a_link_deeper_in_a_write_folder_is_no_reason_to_refuse(files):
    os.symlink("/etc", files / "work" / "etc")
    os.symlink("../../Home", files / "work" / "home")
    part, fds = call_part(files)
    close_all(fds)
    assert part[:3] == ["--bind-fd", str(fds[0]), f"{files}/work"]


def test_a_non_folder_on_a_write_path_is_refused(files):
    (files / "data").write_text("a file\n")
    error = refused(files, ["work", "data"])
    assert error.path == "data" and "is not a folder" in str(error)


# What gets bound.

def test_write_folders_are_bound_by_descriptor_parents_first_and_made_when_missing(files):
    part, fds = call_part(files, ["work/cache", "work", "out/reports"], folder="work/x")
    try:
        assert part == ["--bind-fd", str(fds[0]), f"{files}/out/reports", "--bind-fd", str(fds[1]), f"{files}/work",
                        "--bind-fd", str(fds[2]), f"{files}/work/cache", "--chdir", f"{files}/work/x"]
        assert (files / "out" / "reports").is_dir() and (files / "work" / "cache").is_dir()
        for fd in fds:
            assert os.path.samefile(f"/proc/self/fd/{fd}", files / part[part.index(str(fd)) + 1])
    finally:
        close_all(fds)


def test_git_hooks_and_config_are_checked_down_to_depth_3(files):
    for repo in ("", "a/", "a/b/", "a/b/c/"):
        git = files / "work" / f"{repo}.git"
        (git / "hooks").mkdir(parents=True)
        (git / "config").write_text("[core]\n")
    look = look_at(files)
    assert sorted(look.noted) == sorted(f"work/{repo}.git/{name}" for repo in ("", "a/", "a/b/")
                                        for name in ("hooks", "config"))


def test_without_write_folders_only_the_folder_is_entered(files):
    part, fds = call_part(files, [], folder=".")
    assert fds == []
    assert part == ["--chdir", str(files)]


def test_a_hook_and_config_written_inside_a_write_folder_are_set_aside_at_the_end(tmp_path):
    require_sandbox()
    box = Agent(tmp_path)
    git = box.files / "work" / "repo" / ".git"
    (git / "hooks").mkdir(parents=True)
    (git / "config").write_text("[core]\n")
    done = box.sh("cd work/repo && (echo evil > .git/hooks/pre-commit) && echo HOOKED; "
                  "(printf '\\tpager = evil\\n' >> .git/config) && echo CONFIGURED; echo fine > .git/HEAD && echo head")
    assert done.stdout == "HOOKED\nCONFIGURED\nhead\n", done.stdout + done.stderr
    assert "work/repo/.git/config: core.pager taken out" in done.stderr
    assert os.listdir(git / "hooks")[0].startswith("pre-commit.lnk-set-aside-")
    assert "pager" not in (git / "config").read_text()


def test_call_part_adds_well_under_a_millisecond(files):
    (files / "data").mkdir()
    for repo in ("repo", "tools/lib"):
        git = files / "work" / repo / ".git"
        (git / "hooks").mkdir(parents=True)
        (git / "config").write_text("[core]\n")
    for n in range(30):
        (files / "work" / "src" / f"m{n}").mkdir(parents=True)
    fd = open_files(files)
    times = []
    try:
        for _ in range(200):
            start = time.perf_counter()
            _, fds = percall.call_part(fd, str(files), ["work", "data"], "work")
            times.append(time.perf_counter() - start)
            close_all(fds)
    finally:
        os.close(fd)
    assert statistics.median(times) < 0.001, statistics.median(times)

"""The git check (linkrun/sandboxing/gitcheck.py, issue 23): with any number
of repositories in the write folders a call runs, a program may move or
remove a repository, and the user's own git, run on the host afterwards,
obeys nothing a program wrote: a hook, core.fsmonitor, core.hooksPath, an
include, a repository moved aside and replaced or made afresh, a `.git`
file, a `commondir`, a config.worktree; through `up` as root and as an
ordinary user, and through the `sandbox` command. Also what review found
before: a thousand `.git` folders that exhausted serve's descriptors; and a
gap shown as it is: a socket in a read-only folder can still be connected to.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO, require_sandbox, text_of, wait_for
from percall_helpers import call_part, close_all
from gitguard_helpers import PLANT, VECTORS, make_repositories, obeyed, owner_of
from sandbox_helpers import Agent
from up_harness import Up

from linkrun import errors
from linkrun.sandboxing import gitcheck, percall
from linkrun.sandboxing.gitcheck import Meanwhile


def git(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The user's own git, run outside any sandbox."""
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"})


def guarded(part: list[str], files: Path) -> list[str]:
    """What the part binds read-only, relative to the files folder."""
    return sorted(os.path.relpath(part[i + 2], files) for i, arg in enumerate(part) if arg == "--ro-bind-fd")


def pinned(part: list[str], files: Path) -> list[str]:
    """What the part binds writable (the write folders and the folders pinned in place)."""
    return sorted(os.path.relpath(part[i + 2], files) for i, arg in enumerate(part) if arg == "--bind-fd")


def make_repository(path: Path, *, bare: bool = False) -> Path:
    """A repository with no hooks (an empty template, and an empty hooks/): its git folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", "--template=", *(["--bare"] if bare else []), str(path)], check=True)
    git_dir = path if bare else path / ".git"
    (git_dir / "hooks").mkdir()
    return git_dir


@pytest.fixture
def files(tmp_path) -> Path:
    folder = tmp_path / "agent" / "Files"
    (folder / "work").mkdir(parents=True)
    return folder


# What must hold at once (issue 23, D2): any count of repositories, a call
# runs; a program removes a repository; the user's git obeys nothing planted.

def test_each_vector_fires_when_planted_on_the_host(tmp_path):
    # So that the tests below, where none fires, test something.
    work = tmp_path / "work"
    work.mkdir()
    make_repositories(work)
    subprocess.run(["sh", "-c", PLANT, "sh", str(work)], check=True, capture_output=True)
    assert obeyed(work) == sorted(VECTORS)


def test_65_repositories_in_the_write_folders_do_not_stop_a_call(up_as: Up):
    work = up_as.agent / "Files" / "work"
    account = owner_of(work)
    for i in range(65):
        (work / "r" / str(i) / ".git" / "hooks").mkdir(parents=True)
    for folder, names, _ in os.walk(work / "r"):
        for name in [".", *names]:
            os.chown(os.path.join(folder, name), account.pw_uid, account.pw_gid)
    assert "output (4 bytes):\nran\n" in up_as.python("print('ran')")
    assert "removed" in up_as.python("import shutil\nshutil.rmtree('work/r')\nprint('removed')")
    assert not (work / "r").exists()


def test_a_program_removes_a_repository_it_made(up_as: Up):
    made = up_as.command("sh", "-c", "git init -q work/mine && echo made")
    assert not made.get("isError") and "made" in text_of(made), text_of(made)
    removed = up_as.command("sh", "-c", "rm -rf work/mine && echo removed")
    assert not removed.get("isError") and "removed" in text_of(removed), text_of(removed)
    assert not (up_as.agent / "Files" / "work" / "mine").exists()


def test_what_a_call_plants_in_a_repository_is_not_obeyed_by_the_users_git_afterwards(up_as: Up):
    work = up_as.agent / "Files" / "work"
    make_repositories(work)
    planted = up_as.command("sh", "-c", PLANT, "sh", str(work))
    assert "planted" in text_of(planted), text_of(planted)
    # The agent is told what was set aside, and why.
    assert "[the user's git would have run what this call wrote into a repository; set aside: " in text_of(planted)
    assert "work/fsmonitor/.git/config: core.fsmonitor taken out" in text_of(planted)
    assert obeyed(work) == []


def test_what_a_background_command_plants_is_not_obeyed_once_it_ended(up_as: Up):
    work = up_as.agent / "Files" / "work"
    make_repositories(work)
    command_id = up_as.start("sh", "-c", PLANT, "sh", str(work))
    up_as.wait_ended(command_id)
    assert "planted" in up_as.read_all(command_id)
    assert obeyed(work) == []


def test_what_a_running_background_command_plants_is_set_aside_within_seconds(up_as: Up):
    # Its supervisor checks while it runs (gitcheck.Meanwhile), not only at its end.
    work = up_as.agent / "Files" / "work"
    make_repositories(work)
    hook = work / "hook" / ".git" / "hooks" / "pre-commit"
    command_id = up_as.start("sh", "-c", f"mkdir -p {hook.parent}; printf '#!/bin/sh\\ntouch {work}/MARK-hook\\n' > {hook}; chmod +x {hook}; "
                             f"git -C {work}/fsmonitor config core.fsmonitor 'touch {work}/MARK-fsmonitor #'; "
                             "echo planted; exec sleep 120")
    wait_for(lambda: "planted" in up_as.read_all(command_id), timeout=30, what="the command to plant")
    wait_for(lambda: not hook.exists() and "fsmonitor" not in (work / "fsmonitor" / ".git" / "config").read_text(),
             timeout=3 * Meanwhile.EVERY + 10, what="the supervisor's check to set them aside")
    assert obeyed(work, ("hook", "fsmonitor")) == []
    assert [name.startswith("pre-commit.lnk-set-aside-") for name in os.listdir(hook.parent)] == [True]
    up_as.stop(command_id)


def test_what_a_long_call_plants_is_set_aside_while_it_runs(up_as: Up):
    work = up_as.agent / "Files" / "work"
    make_repositories(work)
    hook = work / "hook" / ".git" / "hooks" / "pre-commit"
    answers: list[dict] = []
    call = threading.Thread(target=lambda: answers.append(up_as.command(
        "sh", "-c", f"mkdir -p {hook.parent}; printf '#!/bin/sh\\ntouch {work}/MARK-hook\\n' > {hook}; chmod +x {hook}; "
        f"while [ -e {hook} ]; do sleep 0.1; done; echo gone")))
    call.start()
    try:
        wait_for(lambda: hook.exists() or answers, timeout=30, what="the call to plant")
        assert not answers, text_of(answers[0])
        wait_for(lambda: not hook.exists(), timeout=3 * Meanwhile.EVERY + 10, what="the check while the call runs")
        assert obeyed(work, ("hook",)) == []
    finally:
        call.join(timeout=60)
    assert "gone" in text_of(answers[0]) and "work/hook/.git/hooks/pre-commit: set aside" in text_of(answers[0])


# Many repositories: the call's part costs the same whatever their number.

def thousand(files: Path) -> None:
    for i in range(1100):
        (files / "work" / "r" / str(i) / ".git" / "hooks").mkdir(parents=True)
        (files / "work" / "r" / str(i) / ".git" / "config").write_text("[core]\n\tbare = false\n")


def test_a_thousand_repositories_add_nothing_to_the_calls_binds(files):
    thousand(files)
    part, fds = call_part(files)
    close_all(fds)
    assert guarded(part, files) == [] and pinned(part, files) == ["work"] and len(fds) == 1


def test_a_thousand_git_folders_do_not_exhaust_1024_descriptors(files):
    # Review: serve at `nofile` 1024 answered every call "Too many open files".
    thousand(files)
    program = ("import os, sys\nsys.path[:0] = [sys.argv[2], sys.argv[3]]\n"
               "from linkrun.sandboxing import gitcheck, percall\n"
               "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"
               "look = gitcheck.look(fd, sys.argv[1], ['work'])\npart, fds = percall.call_part(fd, sys.argv[1], ['work'], '')\n"
               "print(len(look.noted), look.check(fd), len(fds))\n")
    done = subprocess.run(["prlimit", "--nofile=1024:1024", "--", sys.executable, "-I", "-c", program, str(files),
                           str(REPO), str(Path(__file__).parent)], capture_output=True, text=True, timeout=60)
    assert done.stdout == "2200 [] 1\n", done.stdout + done.stderr  # each one's config and hooks


def test_a_hook_planted_in_the_last_of_a_thousand_repositories_is_set_aside(files):
    thousand(files)
    look = open_and_look(files)
    hook = files / "work" / "r" / "1099" / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\n")
    notes = check(look, files)
    assert len(notes) == 1 and "work/r/1099/.git/hooks/pre-commit: set aside" in notes[0]
    assert not hook.exists()


def test_a_repository_below_two_write_folders_is_checked_once(files):
    make_repository(files / "work" / "a" / "b")
    look = open_and_look(files, ["work", "work/a"])
    (files / "work" / "a" / "b" / ".git" / "hooks" / "post-checkout").write_text("#!/bin/sh\n")
    assert len(check(look, files)) == 1


def open_and_look(files: Path, write: list[str] | None = None) -> gitcheck.GitLook:
    fd = os.open(files, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return gitcheck.look(fd, str(files), write or ["work"])
    finally:
        os.close(fd)


def check(look: gitcheck.GitLook, files: Path) -> list[str]:
    return gitcheck.after(look)


# A program may move and remove repositories; what it leaves is checked.

def test_a_repository_moved_aside_and_replaced_runs_nothing_of_the_programs(tmp_path):
    require_sandbox()
    box = Agent(tmp_path)
    repo = box.files / "work" / "repo"
    make_repository(repo)
    done = box.sh("cd work/repo && mv .git .git-old && mkdir .git && cp -r .git-old/HEAD .git-old/objects "
                  ".git-old/refs .git/ && printf '[core]\\n\\tfsmonitor = touch %s/MARK\\n' \"$PWD\" > .git/config; "
                  "cd .. && mv repo repo-old && mv repo-old repo && echo moved")
    assert done.stdout == "moved\n", done.stderr
    assert "work/repo/.git/config: core.fsmonitor taken out" in done.stderr
    assert git("status", cwd=repo).returncode == 0
    assert not (repo / "MARK").exists()


def test_the_check_follows_no_link_a_racing_program_plants(tmp_path):
    # What replaced a repository by a link to the user's own is not looked into.
    files = tmp_path / "agent" / "Files"
    (files / "work").mkdir(parents=True)
    theirs = make_repository(tmp_path / "users-own")
    (theirs / "hooks" / "pre-commit").write_text("#!/bin/sh\necho the user's own\n")
    make_repository(files / "work" / "r")
    look = open_and_look(files)
    shutil.rmtree(files / "work" / "r")
    os.symlink(tmp_path / "users-own", files / "work" / "r")
    assert check(look, files) == []
    assert (theirs / "hooks" / "pre-commit").exists()


# commondir, config.worktree, `.git` files, bare repositories.

def test_a_commondir_planted_by_one_call_is_set_aside_and_the_next_call_runs(tmp_path):
    require_sandbox()
    box = Agent(tmp_path)
    make_repository(box.files / "work" / "repo")
    done = box.sh("echo ../../evil > work/repo/.git/commondir")
    assert done.returncode == 0 and "work/repo/.git/commondir: set aside" in done.stderr, done.stderr
    assert not (box.files / "work" / "repo" / ".git" / "commondir").exists()
    assert box.sh("echo ran").stdout == "ran\n"


def test_a_config_worktree_a_program_writes_keeps_nothing_that_runs(files):
    git_dir = make_repository(files / "work" / "b")
    git("config", "extensions.worktreeConfig", "true", cwd=git_dir.parent)
    look = open_and_look(files)
    (git_dir / "config.worktree").write_text("[core]\n\tsshCommand = touch MARK\n\tsparseCheckout = true\n")
    assert check(look, files) == ["work/b/.git/config.worktree: core.sshcommand taken out (git would have run what "
                                  "they name)"]
    assert git("config", "--file", "config.worktree", "--list", cwd=git_dir).stdout == "core.sparsecheckout=true\n"


def test_a_git_file_pointing_out_of_the_write_folders_is_set_aside(files):
    (files / "work" / "wt").mkdir()
    look = open_and_look(files)
    (files / "work" / "wt" / ".git").write_text("gitdir: /elsewhere/.git/worktrees/wt\n")
    assert [note.split(":")[0] for note in check(look, files)] == ["work/wt/.git"]
    assert not (files / "work" / "wt" / ".git").exists()


def test_bare_repositories_are_checked_at_depth_1_or_named_git_at_depth_2(files):
    for bare in ("backup.git", "a/mirror.git", "a/b/deep.git", "c/mirror"):
        make_repository(files / "work" / bare, bare=True)
    look = open_and_look(files)
    for bare in ("backup.git", "a/mirror.git", "a/b/deep.git", "c/mirror"):
        (files / "work" / bare / "hooks" / "post-receive").write_text("#!/bin/sh\n")
    assert sorted(note.split(":")[0] for note in check(look, files)) == [
        "work/a/mirror.git/hooks/post-receive", "work/backup.git/hooks/post-receive"]


def test_a_hook_planted_in_a_bare_repository_is_not_run_by_a_push(tmp_path):
    require_sandbox()
    box = Agent(tmp_path)
    bare = make_repository(box.files / "work" / "backup.git", bare=True)
    mark = box.files / "work" / "MARK"
    done = box.sh(f"cd work; printf '[core]\\n\\thooksPath = /tmp\\n' >> backup.git/config; "
                  f"mkdir -p backup.git/hooks; printf '#!/bin/sh\\ntouch {mark}\\n' > backup.git/hooks/post-receive; "
                  "chmod +x backup.git/hooks/post-receive; mv backup.git b; mv b backup.git; echo done")
    assert done.stdout == "done\n", done.stderr
    # The user pushes to the backup: its hooks would run, outside any sandbox.
    clone = tmp_path / "clone"
    assert git("clone", "-q", str(bare), str(clone), cwd=tmp_path).returncode == 0
    git("-c", "user.name=u", "-c", "user.email=u@example.org", "commit", "-q", "--allow-empty", "-m", "x", cwd=clone)
    pushed = git("push", "-q", "origin", "HEAD:main", cwd=clone)
    assert pushed.returncode == 0, pushed.stderr
    assert not mark.exists()


# A gap shown as it is.

def test_known_gap_a_socket_in_a_read_only_folder_can_be_connected_to(tmp_path):
    """Not a guarantee: docs/security.md names this gap. A read-only bind does
    not stop connect(2), and seccomp cannot see a socket's address."""
    require_sandbox()
    box = Agent(tmp_path)
    home = os.open(box.root / "Home", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(f"/proc/self/fd/{home}/agent.sock")  # a socket's path has at most 107 bytes
        os.close(home)
        listener.listen()
        done = box.run("python3", "-c", "import os, socket, sys\nos.chdir(sys.argv[1])\n"
                       "s = socket.socket(socket.AF_UNIX)\ns.connect('agent.sock')\n"
                       "s.sendall(b'hello from inside')", str(box.root / "Home"))
        assert done.returncode == 0, done.stderr
        listener.settimeout(30)
        peer, _ = listener.accept()
        with peer:
            assert peer.recv(100) == b"hello from inside"


@pytest.mark.parametrize("name", ["LinkOnPath"])
def test_the_refusals_are_refused_errors_with_a_hint(name):
    assert issubclass(getattr(percall, name), errors.Refused)

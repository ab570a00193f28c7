"""The `.git` guard of the per-call part (DESIGN.md §6), against what review
found past it: a thousand `.git` folders that exhaust serve's descriptors, a
repository moved aside (or swapped by a racing program) so that its guards
land elsewhere, a `commondir` that points git at a planted config, a bare
repository, a `.git` file rewritten; and a gap shown as it is: a socket in a
read-only folder can still be connected to.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, require_sandbox
from percall_helpers import call_part, close_all, refused
from sandbox_helpers import Agent

from linkrun import errors
from linkrun.sandboxing import percall


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
    """A repository with no hooks (an empty template): its git folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", "--template=", *(["--bare"] if bare else []), str(path)], check=True)
    return path if bare else path / ".git"


@pytest.fixture
def files(tmp_path) -> Path:
    folder = tmp_path / "agent" / "Files"
    (folder / "work").mkdir(parents=True)
    return folder


# Many repositories.

def test_more_than_64_repositories_refuse_the_call_naming_them_and_what_to_do(files):
    for i in range(1100):
        (files / "work" / "r" / str(i) / ".git").mkdir(parents=True)
    error = refused(files, kind=percall.TooManyRepositories)
    assert isinstance(error, errors.Refused)
    text = str(error)
    assert "more than 64 git repositories" in text and "work/r/" in text, text
    assert "remove" in text


def test_a_thousand_git_folders_do_not_exhaust_1024_descriptors(files):
    # Review: serve at `nofile` 1024 answered every call "Too many open files".
    for i in range(1100):
        (files / "work" / "r" / str(i) / ".git").mkdir(parents=True)
    program = ("import os, sys\nsys.path[:0] = [sys.argv[2], sys.argv[3]]\nfrom linkrun.sandboxing import percall\n"
               "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"
               "try:\n    percall.call_part(fd, sys.argv[1], ['work'], '')\n"
               "except Exception as error:\n    print(type(error).__name__, error)\n")
    done = subprocess.run(["prlimit", "--nofile=1024:1024", "--", sys.executable, "-I", "-c", program, str(files),
                           str(REPO), str(Path(__file__).parent)], capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith("TooManyRepositories"), done.stdout + done.stderr


def test_64_repositories_are_all_guarded(files):
    for i in range(64):
        (files / "work" / "r" / str(i) / ".git").mkdir(parents=True)
    part, fds = call_part(files)
    close_all(fds)
    assert len([g for g in guarded(part, files) if g.endswith("/hooks")]) == 64


def test_a_repository_below_two_write_folders_counts_once(files):
    for i in range(64):
        (files / "work" / "a" / str(i) / ".git").mkdir(parents=True)
    part, fds = call_part(files, ["work", "work/a"])
    close_all(fds)
    assert len([g for g in guarded(part, files) if g.endswith("/hooks")]) == 64


# Pinned in place.

def test_the_path_to_each_repository_is_pinned_in_place(files):
    make_repository(files / "work" / "a" / "b")
    make_repository(files / "work" / "c")
    part, fds = call_part(files)
    close_all(fds)
    assert pinned(part, files) == ["work", "work/a", "work/a/b", "work/a/b/.git", "work/c", "work/c/.git"]
    assert guarded(part, files) == ["work/a/b/.git/config", "work/a/b/.git/hooks",
                                    "work/c/.git/config", "work/c/.git/hooks"]
    # Parents are bound before what lies inside them.
    binds = [part[i + 2] for i, arg in enumerate(part) if arg in ("--bind-fd", "--ro-bind-fd")]
    assert binds.index(f"{files}/work/a/b/.git") < binds.index(f"{files}/work/a/b/.git/hooks")


def test_a_program_cannot_move_a_repository_aside_and_plant_one_that_runs_its_command(tmp_path):
    require_sandbox()
    box = Agent(tmp_path)
    repo = box.files / "work" / "repo"
    make_repository(repo)
    done = box.sh("cd work/repo && mv .git .git-old && mkdir .git && cp -r .git-old/HEAD .git-old/objects "
                  ".git-old/refs .git/ && printf '[core]\\n\\tfsmonitor = touch %s/MARK\\n' \"$PWD\" > .git/config; "
                  "cd .. && mv repo repo-old")
    assert done.stderr.count("Device or resource busy") == 2, done.stderr
    git("status", cwd=repo)
    assert not (repo / "MARK").exists()
    assert (repo / ".git" / "HEAD").is_file() and os.listdir(repo / ".git" / "hooks") == []


def test_a_racing_program_cannot_swap_a_repository_for_a_decoy(tmp_path):
    # Review: a background command swapping work/r with a decoy at depth 4
    # (renameat2 RENAME_EXCHANGE) landed the next call's guards on the decoy.
    require_sandbox()
    box = Agent(tmp_path)
    make_repository(box.files / "work" / "r")
    (box.files / "work" / "x" / "y" / "z" / "d" / ".git" / "hooks").mkdir(parents=True)
    done = box.run("python3", "-c", "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nos.chdir('work')\n"
                   "for a, b in (('r', 'x/y/z/d'), ('r/.git', 'x/y/z/d/.git')):\n"
                   "    print(libc.renameat2(-100, a.encode(), -100, b.encode(), 2), os.strerror(ctypes.get_errno()))")
    # r is a mount point (EBUSY); r/.git is another mount than the decoy's (EXDEV).
    assert done.stdout == "-1 Device or resource busy\n-1 Invalid cross-device link\n", done.stdout + done.stderr


# commondir, config.worktree, `.git` files, bare repositories.

def test_a_commondir_in_a_git_folder_refuses_the_call(files):
    git_dir = make_repository(files / "work" / "repo")
    (files / "work" / "evil").mkdir()
    (git_dir / "commondir").write_text("../../evil\n")
    error = refused(files)
    assert error.path == "work/repo/.git/commondir"
    assert "points git at another folder" in str(error) and "rm " in str(error)


def test_a_commondir_planted_by_one_call_refuses_the_next(tmp_path):
    require_sandbox()
    box = Agent(tmp_path)
    make_repository(box.files / "work" / "repo")
    done = box.sh("echo ../../evil > work/repo/.git/commondir")
    assert done.returncode == 0, done.stderr  # `.git` stays writable: git needs it
    done = box.sh("echo ran")
    assert done.returncode != 0 and "ran" not in done.stdout
    assert "work/repo/.git/commondir in the files folder points git at another folder" in done.stderr


def test_config_worktree_is_guarded_and_made_when_the_config_reads_it(files):
    git_dir = make_repository(files / "work" / "a")
    (git_dir / "config.worktree").write_text("[core]\n")
    other = make_repository(files / "work" / "b")
    git("config", "extensions.worktreeConfig", "true", cwd=other.parent)
    part, fds = call_part(files)
    close_all(fds)
    assert "work/a/.git/config.worktree" in guarded(part, files)
    assert "work/b/.git/config.worktree" in guarded(part, files)
    assert (other / "config.worktree").read_text() == ""  # empty: git reads it as no setting


def test_a_git_file_is_bound_read_only_and_its_folder_pinned(files):
    (files / "work" / "wt").mkdir()
    (files / "work" / "wt" / ".git").write_text("gitdir: /elsewhere/.git/worktrees/wt\n")
    part, fds = call_part(files)
    close_all(fds)
    assert guarded(part, files) == ["work/wt/.git"]
    assert pinned(part, files) == ["work", "work/wt"]


def test_bare_repositories_are_guarded_at_depth_1_or_named_git_at_depth_2(files):
    for bare in ("backup.git", "a/mirror.git", "a/b/deep.git", "c/mirror"):
        make_repository(files / "work" / bare, bare=True)
    part, fds = call_part(files)
    close_all(fds)
    assert guarded(part, files) == ["work/a/mirror.git/config", "work/a/mirror.git/hooks",
                                    "work/backup.git/config", "work/backup.git/hooks"]


def test_bare_repositories_git_files_and_config_worktree_are_read_only_inside(tmp_path):
    require_sandbox()
    box = Agent(tmp_path)
    bare = make_repository(box.files / "work" / "backup.git", bare=True)
    (box.files / "work" / "wt").mkdir()
    (box.files / "work" / "wt" / ".git").write_text(f"gitdir: {bare}\n")
    config = (bare / "config").read_text()
    mark = box.files / "work" / "MARK"
    done = box.sh(f"cd work; printf '[core]\\n\\thooksPath = /tmp\\n' >> backup.git/config; "
                  f"printf '#!/bin/sh\\ntouch {mark}\\n' > backup.git/hooks/post-receive; "
                  "chmod +x backup.git/hooks/post-receive; echo gitdir: ../evil > wt/.git; "
                  "mv wt wt-old; mv backup.git b; echo done")
    assert done.stdout == "done\n", done.stderr
    assert (bare / "config").read_text() == config and os.listdir(bare / "hooks") == []
    assert (box.files / "work" / "wt" / ".git").read_text() == f"gitdir: {bare}\n"
    # The user pushes to the backup: its hooks run, outside any sandbox.
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


@pytest.mark.parametrize("name", ["LinkOnPath", "TooManyRepositories"])
def test_the_refusals_are_refused_errors_with_a_hint(name):
    assert issubclass(getattr(percall, name), errors.Refused)

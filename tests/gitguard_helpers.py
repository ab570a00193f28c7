"""What a program plants in a repository, and the user's own git run on the
host afterwards, as the user who owns the agent's files (tests/test_gitguard.py)."""

from __future__ import annotations

import os
import pwd
import subprocess
import tempfile
from pathlib import Path

# Each vector in a repository of its own (so that one set aside cannot hide
# another), each leaving MARK-<name> in work/ when a git run obeys it. Run as
# `sh -c PLANT <work>`, inside a sandbox or (to show each one fires) on the host.
VECTORS = ("hook", "fsmonitor", "hookspath", "include", "aside", "new", "gitfile", "commondir", "worktree")
PLANT = r"""

W=$1
cd "$W"
mark() { printf 'touch %s/MARK-%s #' "$W" "$1"; }
hook() { mkdir -p "$(dirname "$1")"; printf '#!/bin/sh\n%s\n' "$(mark "$2")" > "$1"; chmod +x "$1"; }
hook hook/.git/hooks/pre-commit hook
git -C fsmonitor config core.fsmonitor "$(mark fsmonitor)"
mkdir -p hookdir && hook hookdir/pre-commit hookspath
git -C hookspath config core.hooksPath "$W/hookdir"
printf '[core]\n\tfsmonitor = %s\n' "$(mark include)" > evil.cfg
git -C include config include.path "$W/evil.cfg"
mv aside/.git aside/.git-aside && git init -q --template= aside
hook aside/.git/hooks/pre-commit aside && git -C aside config core.fsmonitor "$(mark aside)"
git init -q --template= new && hook new/.git/hooks/pre-commit new && git -C new config core.fsmonitor "$(mark new)"
git init -q --template= deep/a/b/c/x && hook deep/a/b/c/x/.git/hooks/pre-commit gitfile
git -C deep/a/b/c/x config core.fsmonitor "$(mark gitfile)"
rm -rf gitfile/.git && echo "gitdir: $W/deep/a/b/c/x/.git" > gitfile/.git
git init -q --template= --bare deep/a/b/c/y && hook deep/a/b/c/y/hooks/pre-commit commondir
git --git-dir=deep/a/b/c/y config core.fsmonitor "$(mark commondir)"
echo "$W/deep/a/b/c/y" > commondir/.git/commondir
git -C worktree config extensions.worktreeConfig true 2>/dev/null || true
git -C worktree config --worktree core.fsmonitor "$(mark worktree)" 2>/dev/null || printf '[core]\n\tfsmonitor = %s\n' "$(mark worktree)" > worktree/.git/config.worktree
echo planted
"""


def owner_of(path: Path) -> pwd.struct_passwd:
    return pwd.getpwuid(os.stat(path).st_uid)


def host_git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    """The user's own git in `repo`, outside any sandbox, as the owner of its
    folder (root's git would refuse another user's repository, and obey nothing)."""
    account = owner_of(repo)
    home = tempfile.mkdtemp(prefix="lnk-git-home-")
    os.chown(home, account.pw_uid, account.pw_gid)
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "u",
           "GIT_AUTHOR_EMAIL": "u@example.org", "GIT_COMMITTER_NAME": "u", "GIT_COMMITTER_EMAIL": "u@example.org"}
    prefix = [] if account.pw_uid == os.geteuid() else ["runuser", "-u", account.pw_name, "--"]
    try:
        return subprocess.run([*prefix, "env", *(f"{k}={v}" for k, v in env.items()), "git", *args], cwd=repo,
                              capture_output=True, text=True, timeout=60, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    finally:
        os.rmdir(home)


def make_repositories(work: Path) -> None:
    """The repositories PLANT expects, each with a commit, owned as `work` is."""
    account = owner_of(work)
    for name in ("hook", "fsmonitor", "hookspath", "include", "aside", "gitfile", "commondir", "worktree"):
        repo = work / name
        subprocess.run(["git", "init", "-q", "--template=", str(repo)], check=True)
        (repo / "file").write_text("x\n")
        subprocess.run(["git", "-C", str(repo), "add", "file"], check=True)
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=u", "-c", "user.email=u@example.org", "commit", "-q",
                        "-m", "first"], check=True)
    for folder, _, names in os.walk(work):
        for name in [".", *names]:
            os.lchown(os.path.join(folder, name), account.pw_uid, account.pw_gid)


def obeyed(work: Path, names: tuple[str, ...] = VECTORS) -> list[str]:
    """Run the user's git in each repository (status, then a commit), and name
    the vectors whose command ran. Every run must work (or be refused as no
    repository, for one set aside), so that nothing passes because git failed."""
    for name in names:
        repo = work / name
        done = host_git(repo, "status", "--short")
        assert done.returncode == 0 or "not a git repository" in done.stderr, (name, done.stderr)
        host_git(repo, "commit", "-q", "--allow-empty", "-m", "by the user")  # runs its hooks, if it can
    return sorted(name for name in names if (work / f"MARK-{name}").exists())

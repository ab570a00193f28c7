"""The git check's rule for configs and hooks (linkrun/sandboxing/gitcheck.py,
gitconfig.py), on a files folder with no sandbox: what a program adds that
could run a program is taken out or set aside; what the user had is kept."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from linkrun.sandboxing import gitcheck, gitconfig

# Keys that make git run a program, or read a file that could: each is taken out.
RUNS_A_PROGRAM = [
    ("core.fsmonitor", "touch MARK"), ("core.hooksPath", "/tmp/hooks"), ("core.sshCommand", "touch MARK"),
    ("core.gitProxy", "touch MARK"), ("core.pager", "touch MARK"), ("core.editor", "touch MARK"),
    ("core.askPass", "touch MARK"), ("sequence.editor", "touch MARK"), ("alias.st", "!touch MARK"),
    ("alias.lg", "-c core.fsmonitor=x status"), ("filter.x.clean", "touch MARK"), ("filter.x.process", "touch MARK"),
    ("diff.external", "touch MARK"), ("diff.x.textconv", "touch MARK"), ("merge.x.driver", "touch MARK"),
    ("credential.helper", "!touch MARK"), ("gpg.program", "touch MARK"), ("pager.log", "touch MARK"),
    ("include.path", "../evil"), ("includeIf.gitdir:/.path", "../evil"), ("url.ext::sh.insteadOf", "https://x/"),
    ("protocol.allow", "always"), ("remote.origin.uploadpack", "touch MARK"),
    ("remote.origin.receivepack", "touch MARK"), ("remote.origin.vcs", "evil"), ("remote.origin.url", "ext::sh -c x"),
    ("remote.up.url", "/some/bare.git"), ("submodule.s.update", "!touch MARK"), ("web.browser", "evil"),
    ("difftool.x.cmd", "touch MARK"), ("mergetool.x.cmd", "touch MARK"), ("trailer.x.command", "touch MARK"),
    ("hook.x.command", "touch MARK"), ("some.future.key", "x"),
]
KEPT = [("user.name", "u"), ("remote.origin.url", "https://example.org/r.git"),
        ("remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*"), ("branch.main.remote", "origin"),
        ("submodule.s.url", "git@example.org:s.git"), ("submodule.s.update", "rebase"),
        ("extensions.worktreeConfig", "true")]


def git_config(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", "config", "--file", str(git_dir / "config"), *args], check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture
def files(tmp_path) -> Path:
    folder = tmp_path / "Files"
    subprocess.run(["git", "init", "-q", "--template=", str(folder / "work" / "repo")], check=True)
    return folder


def look(files: Path) -> gitcheck.GitLook:
    fd = os.open(files, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return gitcheck.look(fd, str(files), ["work"])
    finally:
        os.close(fd)


def test_each_key_that_runs_a_program_is_taken_out_and_the_rest_kept(files):
    git_dir = files / "work" / "repo" / ".git"
    before = look(files)
    for key, value in RUNS_A_PROGRAM + KEPT:
        git_config(git_dir, "--add", key, value)
    notes = gitcheck.after(before)
    assert len(notes) == 1 and "taken out" in notes[0], notes
    left = git_config(git_dir, "--list").splitlines()
    for key, value in KEPT:
        assert f"{key.lower()}={value}" in left
    for key, value in RUNS_A_PROGRAM:
        assert f"{key.lower()}={value}" not in [line.lower() for line in left], key


def test_what_the_user_had_is_kept_when_a_program_changes_the_config(files):
    git_dir = files / "work" / "repo" / ".git"
    git_config(git_dir, "alias.lg", "!git log --oneline")
    (git_dir / "hooks").mkdir()
    (git_dir / "hooks" / "pre-commit").write_text("#!/bin/sh\necho the user's\n")
    old = os.stat(git_dir / "hooks" / "pre-commit").st_ctime_ns
    os.utime(git_dir / "hooks" / "pre-commit", ns=(old - 10**10, old - 10**10))
    before = look(files)
    before.taken += 2 * gitcheck.RACY  # as if the look came later: nothing here is racy
    git_config(git_dir, "core.editor", "evil")
    assert gitcheck.after(before) == ["work/repo/.git/config: core.editor taken out (git would have run what they "
                                      "name)"]
    assert git_config(git_dir, "alias.lg").strip() == "!git log --oneline"
    assert (git_dir / "hooks" / "pre-commit").exists()


def test_a_hook_changed_in_place_is_set_aside(files):
    hooks = files / "work" / "repo" / ".git" / "hooks"
    hooks.mkdir()
    (hooks / "post-checkout").write_text("#!/bin/sh\n")
    (hooks / "pre-push.sample").write_text("#!/bin/sh\n")
    before = look(files)
    with open(hooks / "post-checkout", "a") as hook:
        hook.write("touch MARK\n")
    (hooks / "pre-push.sample").write_text("#!/bin/sh\ntouch MARK\n")  # git never runs a *.sample
    notes = gitcheck.after(before)
    assert [note.split(":")[0] for note in notes] == ["work/repo/.git/hooks/post-checkout"]


def test_a_config_git_cannot_read_is_set_aside_whole(files):
    git_dir = files / "work" / "repo" / ".git"
    before = look(files)
    (git_dir / "config").write_text("[core\n\tfsmonitor = touch MARK\n")
    notes = gitcheck.after(before)
    assert notes[0].startswith("work/repo/.git/config: set aside as config.lnk-set-aside-"), notes
    assert not (git_dir / "config").exists()


def test_a_submodules_git_folder_is_checked_wherever_its_worktree(files):
    modules = files / "work" / "repo" / ".git" / "modules" / "libs" / "deep"
    subprocess.run(["git", "init", "-q", "--template=", "--bare", str(modules)], check=True)
    before = look(files)
    subprocess.run(["git", "config", "--file", str(modules / "config"), "core.fsmonitor", "touch MARK"], check=True)
    assert gitcheck.after(before) == ["work/repo/.git/modules/libs/deep/config: core.fsmonitor taken out (git would "
                                      "have run what they name)"]


def test_a_linked_worktrees_commondir_may_name_its_own_repository_only(files):
    linked = files / "work" / "repo" / ".git" / "worktrees" / "wt"
    linked.mkdir(parents=True)
    before = look(files)
    (linked / "commondir").write_text("../..\n")
    assert gitcheck.after(before) == []
    before = look(files)
    (linked / "commondir").write_text("/elsewhere\n")
    assert gitcheck.after(before)[0].startswith("work/repo/.git/worktrees/wt/commondir: set aside")


def test_allowed_checks_the_value_of_a_remote_url_and_a_submodule_update():
    assert gitconfig.allowed(("remote.origin.url", "https://example.org/x.git"))
    assert gitconfig.allowed(("remote.origin.url", "git@example.org:x.git"))
    assert not gitconfig.allowed(("remote.origin.url", "ext::sh -c touch% MARK"))
    assert not gitconfig.allowed(("remote.origin.url", "ssh://-oProxyCommand=x/y"))
    assert not gitconfig.allowed(("remote.origin.url", "../local.git"))
    assert not gitconfig.allowed(("submodule.s.update", "!touch MARK"))
    assert gitconfig.allowed(("submodule.s.update", "merge"))


def test_what_one_run_set_aside_is_not_set_aside_again_by_a_run_that_began_before(files):
    hooks = files / "work" / "repo" / ".git" / "hooks"
    hooks.mkdir()
    longer, shorter = look(files), look(files)  # a background command's look, then a call's
    (hooks / "pre-commit").write_text("#!/bin/sh\n")
    assert len(gitcheck.after(shorter)) == 1
    assert gitcheck.after(longer) == []
    assert [name.startswith("pre-commit.lnk-set-aside-") for name in os.listdir(hooks)] == [True]


def test_the_users_own_hooks_path_in_a_write_folder_is_checked_too(files):
    # husky and others set core.hooksPath to a folder of the worktree, which a program may write.
    repo = files / "work" / "repo"
    git_config(repo / ".git", "core.hooksPath", ".githooks")
    (repo / ".githooks").mkdir()
    (repo / ".githooks" / "pre-push").write_text("#!/bin/sh\necho the user's\n")
    before = look(files)
    before.taken += 2 * gitcheck.RACY  # as if the look came later: the user's hook is not racy
    (repo / ".githooks" / "pre-commit").write_text("#!/bin/sh\ntouch MARK\n")
    assert [note.split(":")[0] for note in gitcheck.after(before)] == ["work/repo/.githooks/pre-commit"]
    assert sorted(os.listdir(repo / ".githooks"))[1] == "pre-push"
    before = look(files)
    os.rename(repo / ".githooks", repo / "elsewhere")
    os.symlink("elsewhere", repo / ".githooks")
    assert [note.split(":")[0] for note in gitcheck.after(before)] == ["work/repo/.githooks"]
    assert not os.path.lexists(repo / ".githooks")

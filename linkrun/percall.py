"""The per-call part of the sandbox argv (DESIGN.md §6), built in process at
every call, just before the `--`.

Stdlib only, importing nothing of ours: the gate (`python -I -S gate.py`)
imports it by putting this folder on sys.path, and serve calls it on every
call, so it must stay cheap (well under a millisecond for a couple of write
folders).

Why descriptors and not paths: the write folders live in the files folder,
which earlier calls could write. A path handed to bwrap is resolved again by
bwrap, following whatever link a program planted there (`work/cache ->
../../Home` would bind the agent's Home writable; `.git/hooks -> ../../../..`
would bind the agent's whole folder, its state included, into the sandbox).
So each folder is opened here one component at a time with O_NOFOLLOW, and
bwrap binds the descriptor (`--bind-fd`): what is bound is what was checked.
A link on any of those paths refuses the call and names it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_PATH: `.git/config` is bound, never read; O_NOFOLLOW with O_PATH opens a
# link itself rather than failing, so the caller fstats what it got.
_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
PROXY_INSIDE = "/run/lnk/proxy"  # internet.INSIDE: this module imports nothing of ours


class LinkOnPath(Exception):
    """A link (or something other than a folder) on a path the sandbox binds.

    `path` is relative to the files folder; the message says what to do.
    """

    def __init__(self, path: str, what: str, files_path: str):
        self.path, self.what = path, what
        super().__init__(
            f"{path} in the files folder {what}, so the call was refused: a program may have "
            f"planted it to reach past its sandbox; remove it from outside the sandbox "
            f"(rm {os.path.join(files_path, path)!r}) and call again"
        )


def call_part(files_fd: int, files_path: str, write: Sequence[str], proxy_dir: str | None,
              folder: str) -> tuple[list[str], list[int]]:
    """The argv fragment for one call, and the descriptors it opened.

    `write` are the write folders, relative to the files folder (checked by
    the caller: no `.`, `..` or empty component); a missing one is created.
    The caller passes the returned descriptors to the sandbox (`pass_fds`, or
    `os.set_inheritable` before an exec) and closes them after the spawn;
    bwrap closes them before it runs the program. On an error every
    descriptor opened here is closed before LinkOnPath is raised.
    """
    opened: list[int] = []
    try:
        part: list[str] = []
        writable: list[tuple[str, int]] = []
        # Sorted, so that a folder is bound before a folder inside it (a
        # `[files] write` entry inside work/ is allowed): the later bind wins.
        for rel in sorted(set(write)):
            fd = _open_write_folder(files_fd, rel, files_path)
            opened.append(fd)
            writable.append((rel, fd))
            part += ["--bind-fd", str(fd), f"{files_path}/{rel}"]
        guarded: set[str] = set()
        for rel, fd in writable:
            for git in _git_folders(fd, rel, files_path):
                for name, fd_ in _guard_git(fd, rel, git, files_path, opened):
                    dest = f"{files_path}/{rel}/{git}/{name}"
                    if dest not in guarded:  # a repository below two write folders
                        guarded.add(dest)
                        part += ["--ro-bind-fd", str(fd_), dest]
        if proxy_dir:
            # The state folder is no program's to write: a path is safe here.
            part += ["--ro-bind", proxy_dir, PROXY_INSIDE]
        folder = folder.strip("/")
        part += ["--chdir", files_path if folder in ("", ".") else f"{files_path}/{folder}"]
        return part, opened
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise


def _open_write_folder(files_fd: int, rel: str, files_path: str) -> int:
    """A descriptor of `rel`, opened one component at a time from the files
    folder, following no link; missing components are created."""
    fd = files_fd
    done: list[str] = []
    try:
        for name in rel.split("/"):
            done.append(name)
            try:
                next_fd = os.open(name, _DIR, dir_fd=fd)
            except FileNotFoundError:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile: opened (and checked) below
                next_fd = _open_dir(fd, name, "/".join(done), files_path)
            except OSError as error:
                raise _refusal(fd, name, "/".join(done), error, files_path) from None
            if fd != files_fd:
                os.close(fd)
            fd = next_fd
        return fd
    except BaseException:
        if fd != files_fd:
            os.close(fd)
        raise


def _open_dir(parent_fd: int, name: str, path: str, files_path: str) -> int:
    try:
        return os.open(name, _DIR, dir_fd=parent_fd)
    except OSError as error:
        raise _refusal(parent_fd, name, path, error, files_path) from None


def _refusal(parent_fd: int, name: str, path: str, error: OSError, files_path: str) -> Exception:
    try:
        target = os.readlink(name, dir_fd=parent_fd)
    except OSError:
        target = None
    if target is not None:
        return LinkOnPath(path, f"is a link (to {target!r})", files_path)
    if error.errno == errno.ENOTDIR:
        return LinkOnPath(path, "is not a folder", files_path)
    if error.errno == errno.ELOOP:
        return LinkOnPath(path, "is a link", files_path)
    return error


def _git_folders(write_fd: int, rel: str, files_path: str) -> list[str]:
    """The `.git` folders at depth ≤ 3 below a write folder (`.git`, `a/.git`,
    `a/b/.git`), found with scandir and lstat, never following a link.

    A race with a running program only changes what is found: what gets bound
    is opened again, component by component, by _guard_git.
    """
    found: list[str] = []
    with os.scandir(write_fd) as entries:
        first = [e.name for e in entries if _is_git_or_dir(e, rel, "", files_path, found)]
    for a in first:
        try:
            a_fd = os.open(a, _DIR, dir_fd=write_fd)
        except OSError:
            continue  # gone or replaced since: nothing of it is bound
        try:
            with os.scandir(a_fd) as entries:
                second = [e.name for e in entries if _is_git_or_dir(e, rel, f"{a}/", files_path, found)]
            for b in second:
                try:
                    mode = os.lstat(f"{b}/.git", dir_fd=a_fd).st_mode
                except OSError:
                    continue
                if stat.S_ISLNK(mode):
                    raise LinkOnPath(f"{rel}/{a}/{b}/.git", "is a link", files_path)
                if stat.S_ISDIR(mode):
                    found.append(f"{a}/{b}/.git")
        finally:
            os.close(a_fd)
    return found


def _is_git_or_dir(entry: os.DirEntry, rel: str, prefix: str, files_path: str, found: list[str]) -> bool:
    """Record a `.git` folder; True for a folder worth looking into."""
    if entry.name == ".git":
        if entry.is_symlink():
            raise LinkOnPath(f"{rel}/{prefix}.git", "is a link", files_path)
        if entry.is_dir(follow_symlinks=False):
            found.append(f"{prefix}.git")
        return False  # a `.git` file (a worktree's, a submodule's) is only a pointer
    return entry.is_dir(follow_symlinks=False)


def _guard_git(write_fd: int, rel: str, git: str, files_path: str,
               opened: list[int]) -> list[tuple[str, int]]:
    """Open `<git>/hooks` (made when missing, so a program cannot add hooks to
    a repository that had none) and `<git>/config`, following no link: the
    (name, fd) pairs to bind read-only. Each descriptor kept goes to `opened`."""
    fd = write_fd
    try:
        done = rel
        for name in git.split("/"):
            done = f"{done}/{name}"
            next_fd = _open_dir(fd, name, done, files_path)
            if fd != write_fd:
                os.close(fd)
            fd = next_fd
        guards = []
        try:
            hooks = os.open("hooks", _DIR, dir_fd=fd)
        except FileNotFoundError:
            try:
                os.mkdir("hooks", 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            hooks = _open_dir(fd, "hooks", f"{done}/hooks", files_path)
        except OSError as error:
            raise _refusal(fd, "hooks", f"{done}/hooks", error, files_path) from None
        opened.append(hooks)
        guards.append(("hooks", hooks))
        try:
            config = os.open("config", _PATH, dir_fd=fd)
        except FileNotFoundError:
            return guards  # not a usable repository: its hooks are guarded all the same
        mode = os.fstat(config).st_mode
        if stat.S_ISREG(mode):
            opened.append(config)
            guards.append(("config", config))
            return guards
        os.close(config)
        if stat.S_ISLNK(mode):
            raise _refusal(fd, "config", f"{done}/config", OSError(errno.ELOOP, "a link"), files_path)
        return guards
    finally:
        if fd != write_fd:
            os.close(fd)

"""The per-call part of the sandbox argv (DESIGN.md §6), built in process at
every call, just before the `--`.

Cheap to import (stdlib and `errors`, which imports nothing): serve calls it
on every call, and a supervisor before its gate, so it must stay cheap (well
under a millisecond for a couple of write folders and repositories).

Why descriptors and not paths: the write folders live in the files folder,
which earlier calls could write. A path handed to bwrap is resolved again by
bwrap, following whatever link a program planted there (`work/cache ->
../../Home` would bind the agent's Home writable; `.git/hooks -> ../../../..`
would bind the agent's whole folder, its state included, into the sandbox).
So each folder is opened here one component at a time with O_NOFOLLOW, and
bwrap binds the descriptor (`--bind-fd`): what is bound is what was checked.
A link on any of those paths refuses the call and names it.

The git guard: each repository within three levels of a write folder (a
`.git` folder or file, or a bare repository) gets its hooks and config bound
read-only, and every folder from the write folder down to its git folder
bound onto itself. A folder that is a mount point cannot be renamed or
removed (EBUSY), so a program can neither move a repository aside and plant
another in its place, nor swap it for a decoy while a later call's bwrap
resolves where to put that call's guards (review: a background command did).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator, Sequence

from ..errors import Refused

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_PATH: a guarded file is bound, never read; O_NOFOLLOW with O_PATH opens a
# link itself rather than failing, so the caller fstats what it got.
_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
# Repositories guarded per call: each costs up to six descriptors and bwrap
# mounts (its pinned folders, hooks, config, config.worktree); 64 is more than
# a workspace holds and keeps a call under 400 descriptors (docs/decisions.md).
MAX_REPOSITORIES = 64


class LinkOnPath(Refused):
    """Something planted on a path the sandbox binds or guards: a link,
    something other than a folder, or a `commondir` that points git elsewhere.

    `path` is relative to the files folder; the hint says what to do.
    """

    def __init__(self, path: str, what: str, files_path: str):
        self.path, self.what = path, what
        super().__init__(
            f"{path} in the files folder {what}, so the call was refused: a program may have "
            f"planted it to reach past its sandbox",
            f"remove it from outside the sandbox (rm {os.path.join(files_path, path)!r}) and call again")


class TooManyRepositories(Refused):
    """More repositories below the write folders than one call guards."""

    def __init__(self, found: list[str], files_path: str):
        self.found = found
        super().__init__(
            f"the write folders hold more than {MAX_REPOSITORIES} git repositories within three levels "
            f"({', '.join(found[:3])}, ...), so the call was refused: the sandbox guards the hooks and config "
            f"of each, and guards at most {MAX_REPOSITORIES}",
            f"a program may have made them: remove those you do not need from outside the sandbox "
            f"(they are in {files_path}), or move them out of the write folders, and call again")


def call_part(files_fd: int, files_path: str, write: Sequence[str], folder: str) -> tuple[list[str], list[int]]:
    """The argv fragment for one call, and the descriptors it opened.

    `write` are the write folders, relative to the files folder (checked by
    the caller: no `.`, `..` or empty component); a missing one is created.
    The caller passes the returned descriptors to the sandbox (`pass_fds`, or
    `os.set_inheritable` before an exec) and closes them after the spawn;
    bwrap closes them before it runs the program. On an error every
    descriptor opened here is closed before the refusal (a Refused) is raised.
    """
    opened: list[int] = []
    try:
        writable: dict[str, int] = {}  # path (relative to the files folder) -> descriptor
        for rel in sorted(set(write)):
            writable[rel] = _open_write_folder(files_fd, rel, files_path)
            opened.append(writable[rel])
        found: list[tuple[str, str, str]] = []
        for rel in list(writable):
            _find_repositories(writable[rel], rel, files_path, found)
        read_only: dict[str, int] = {}
        for rel, path, kind in found:
            _guard(writable, rel, path, kind, files_path, read_only, opened)
        part: list[str] = []
        # Sorted, so that a folder is bound before a folder inside it (a
        # `[files] write` entry inside work/, a pinned folder): the later bind
        # wins. The read-only guards come last, over them.
        for rel in sorted(writable):
            part += ["--bind-fd", str(writable[rel]), f"{files_path}/{rel}"]
        for rel in sorted(read_only):
            part += ["--ro-bind-fd", str(read_only[rel]), f"{files_path}/{rel}"]
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


# Finding repositories: scandir and lstat, never following a link. A race
# with a running program only changes what is found: what gets bound is
# opened again, component by component, by _guard.

def _find_repositories(write_fd: int, rel: str, files_path: str, found: list[tuple[str, str, str]]) -> None:
    """Add to `found` (rel, path below the write folder, kind) for each `.git`
    folder ("git") or file ("pointer") at depth ≤ 3 (`.git`, `a/.git`,
    `a/b/.git`), and each bare repository ("bare") that the listings show
    (the write folder itself, `a`) or named `*.git` (`a/b.git`): one more
    lstat for every folder at depth 2 would double the cost of a
    `node_modules` there."""
    with os.scandir(write_fd) as entries:
        first = _look(entries, rel, "", files_path, found)
    for a in first:
        try:
            a_fd = os.open(a, _DIR, dir_fd=write_fd)
        except OSError:
            continue  # gone or replaced since: nothing of it is bound
        try:
            with os.scandir(a_fd) as entries:
                second = _look(entries, rel, a, files_path, found)
            for b in second:
                _look_below(a_fd, b, rel, f"{a}/{b}", files_path, found)
        finally:
            os.close(a_fd)


def _look(entries: Iterator[os.DirEntry[str]], rel: str, path: str, files_path: str,
          found: list[tuple[str, str, str]]) -> list[str]:
    """Record the repository of the folder at `path` (relative to the write
    folder) from its entries; return its subfolders worth looking into."""
    folders: list[str] = []
    head = git = False
    here = f"{path}/" if path else ""
    for entry in entries:
        if entry.name == ".git":
            kind = _git_kind(entry.is_symlink(), entry.is_dir(follow_symlinks=False),
                             entry.is_file(follow_symlinks=False), f"{rel}/{here}.git", files_path)
            if kind:
                git = True
                _record(found, rel, f"{here}.git", kind, files_path)
        elif entry.is_dir(follow_symlinks=False):
            folders.append(entry.name)
        elif entry.name == "HEAD":
            head = True
    if head and not git and "objects" in folders and "refs" in folders:
        _record(found, rel, path, "bare", files_path)
        return []  # a bare repository holds no other
    return folders


def _look_below(parent_fd: int, name: str, rel: str, path: str, files_path: str,
                found: list[tuple[str, str, str]]) -> None:
    """The same for a folder at depth 2, with lstat alone: its `.git`, or
    whether a folder named `*.git` is a bare repository."""
    mode = _lstat(parent_fd, f"{name}/.git")
    if mode is not None:
        kind = _git_kind(stat.S_ISLNK(mode), stat.S_ISDIR(mode), stat.S_ISREG(mode), f"{rel}/{path}/.git",
                         files_path)
        if kind:
            _record(found, rel, f"{path}/.git", kind, files_path)
        return
    if not name.endswith(".git"):
        return
    head = _lstat(parent_fd, f"{name}/HEAD")
    if head is not None and not stat.S_ISDIR(head) and all(
            stat.S_ISDIR(_lstat(parent_fd, f"{name}/{sub}") or 0) for sub in ("objects", "refs")):
        _record(found, rel, path, "bare", files_path)


def _lstat(dir_fd: int, path: str) -> int | None:
    try:
        return os.lstat(path, dir_fd=dir_fd).st_mode
    except OSError:
        return None


def _git_kind(link: bool, folder: bool, file: bool, path: str, files_path: str) -> str | None:
    if link:
        raise LinkOnPath(path, "is a link", files_path)
    # A `.git` file points to the git folder (a linked worktree's, a submodule's).
    return "git" if folder else "pointer" if file else None


def _record(found: list[tuple[str, str, str]], rel: str, path: str, kind: str, files_path: str) -> None:
    if any(_full(r, p) == _full(rel, path) for r, p, _ in found):
        return  # found before, from a write folder above this one
    found.append((rel, path, kind))
    if len(found) > MAX_REPOSITORIES:
        raise TooManyRepositories([_full(r, p) for r, p, _ in found], files_path)


def _full(rel: str, path: str) -> str:
    return f"{rel}/{path}" if path else rel


# Guarding them.

def _guard(writable: dict[str, int], rel: str, path: str, kind: str, files_path: str,
           read_only: dict[str, int], opened: list[int]) -> None:
    """Pin the folders from the write folder down to the repository's git
    folder (into `writable`), and put what git runs or obeys into `read_only`:
    a `.git` file itself; a git folder's `hooks` (made when missing, so a
    program cannot add hooks to a repository that had none), `config` and
    `config.worktree`. A git folder holding `commondir` is refused: git would
    take its config and hooks from the folder it names."""
    parts = path.split("/") if path else []
    folders = parts[:-1] if kind == "pointer" else parts
    git_fd = _pin(writable, rel, folders, files_path, opened)
    if kind == "pointer":
        _guard_file(git_fd, ".git", f"{rel}/{path}", files_path, read_only, opened)
        return
    git = _full(rel, path)
    if _lstat(git_fd, "commondir") is not None:
        raise LinkOnPath(f"{git}/commondir", "points git at another folder for its config and hooks", files_path)
    if f"{git}/hooks" not in read_only:
        read_only[f"{git}/hooks"] = _hooks(git_fd, f"{git}/hooks", files_path)
        opened.append(read_only[f"{git}/hooks"])
    config = _guard_file(git_fd, "config", f"{git}/config", files_path, read_only, opened)
    if _guard_file(git_fd, "config.worktree", f"{git}/config.worktree", files_path, read_only, opened) is None \
            and config is not None and _reads_worktree_config(config):
        _make_empty(git_fd, "config.worktree")  # or a program could write one
        _guard_file(git_fd, "config.worktree", f"{git}/config.worktree", files_path, read_only, opened)


def _make_empty(dir_fd: int, name: str) -> None:
    try:
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                         dir_fd=dir_fd))
    except FileExistsError:
        pass  # made meanwhile: opened (and checked) by the caller


def _pin(writable: dict[str, int], rel: str, folders: list[str], files_path: str, opened: list[int]) -> int:
    """Open each folder below the write folder, following no link, to be bound
    onto itself; the descriptor of the last (or of the write folder)."""
    fd, path = writable[rel], rel
    for name in folders:
        path = f"{path}/{name}"
        if path not in writable:
            writable[path] = _open_dir(fd, name, path, files_path)
            opened.append(writable[path])
        fd = writable[path]
    return fd


def _hooks(git_fd: int, path: str, files_path: str) -> int:
    try:
        return os.open("hooks", _DIR, dir_fd=git_fd)
    except FileNotFoundError:
        try:
            os.mkdir("hooks", 0o755, dir_fd=git_fd)
        except FileExistsError:
            pass
        return _open_dir(git_fd, "hooks", path, files_path)
    except OSError as error:
        raise _refusal(git_fd, "hooks", path, error, files_path) from None


def _guard_file(dir_fd: int, name: str, path: str, files_path: str, read_only: dict[str, int],
                opened: list[int]) -> int | None:
    """Put a regular file into `read_only`, and return its descriptor; None
    when missing or not a regular file. A link is refused."""
    if path in read_only:
        return read_only[path]
    try:
        fd = os.open(name, _PATH, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        opened.append(fd)
        read_only[path] = fd
        return fd
    os.close(fd)
    if stat.S_ISLNK(mode):
        raise _refusal(dir_fd, name, path, OSError(errno.ELOOP, "a link"), files_path)
    return None


def _reads_worktree_config(config_fd: int) -> bool:
    """Whether a config sets extensions.worktreeConfig (a loose look: a false
    yes only adds an empty, read-only config.worktree)."""
    try:
        fd = os.open(f"/proc/self/fd/{config_fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return b"worktreeconfig" in os.read(fd, 1 << 16).lower()
    except OSError:
        return False
    finally:
        os.close(fd)

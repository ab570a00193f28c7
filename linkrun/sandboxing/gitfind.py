"""Where the repositories of a write folder are (for the git check,
gitcheck.py): scandir and lstat, never following a link, to depth 3. A race
with a running program only changes what is found: the check opens again,
one component at a time, what it notes or changes."""

from __future__ import annotations

import os
import stat
from collections.abc import Generator, Iterator

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

Found = tuple[str, str, tuple[int, str]]  # path, kind, (its folder's descriptor, its name there)


def repositories(write_fd: int, rel: str) -> Iterator[Found]:
    """(path, kind, where) for each `.git` ("git", "pointer" for a file, "link")
    at `W/.git`, `W/a/.git`, `W/a/b/.git`, and each bare repository ("bare")
    the listings show (W, W/a) or named `*.git` at W/a/b."""
    first = yield from _listed(write_fd, rel)
    for a in first:
        try:
            a_fd = os.open(a, _DIR, dir_fd=write_fd)
        except OSError:
            continue
        try:
            second = yield from _listed(a_fd, f"{rel}/{a}")
            for b in second:
                found = _kind_of(a_fd, f"{b}/.git")
                if found:
                    yield f"{rel}/{a}/{b}/.git", found, (a_fd, f"{b}/.git")
                elif b.endswith(".git") and _is_bare(a_fd, b):
                    yield f"{rel}/{a}/{b}", "bare", (a_fd, b)
        finally:
            os.close(a_fd)


def _listed(dir_fd: int, path: str) -> Generator[Found, None, list[str]]:
    folders: list[str] = []
    head = git = False
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            if entry.name == ".git":
                kind = _kind_of(dir_fd, ".git")
                if kind:
                    git = True
                    yield f"{path}/.git", kind, (dir_fd, ".git")
            elif entry.is_dir(follow_symlinks=False):
                folders.append(entry.name)
            elif entry.name == "HEAD":
                head = True
    if head and not git and "objects" in folders and "refs" in folders:
        yield path, "bare", (dir_fd, ".")
        return []  # a bare repository holds no other
    return folders


def _kind_of(dir_fd: int, name: str) -> str | None:
    mode = lstat(dir_fd, name)
    if mode is None:
        return None
    return "git" if stat.S_ISDIR(mode.st_mode) else "pointer" if stat.S_ISREG(mode.st_mode) else "link" \
        if stat.S_ISLNK(mode.st_mode) else None


def _is_bare(parent_fd: int, name: str) -> bool:
    head = lstat(parent_fd, f"{name}/HEAD")
    return head is not None and not stat.S_ISDIR(head.st_mode) and all(
        (s := lstat(parent_fd, f"{name}/{sub}")) is not None and stat.S_ISDIR(s.st_mode) for sub in ("objects", "refs"))


def lstat(dir_fd: int, path: str) -> os.stat_result | None:
    try:
        return os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None

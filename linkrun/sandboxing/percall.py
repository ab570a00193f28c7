"""The per-call part of the sandbox argv (DESIGN.md §6), built in process at
every call, just before the `--`.

Cheap to import (stdlib and `errors`, which imports nothing): serve calls it
on every call, and a supervisor before its gate, so it must stay cheap (well
under a millisecond for a couple of write folders).

Why descriptors and not paths: the write folders live in the files folder,
which earlier calls could write. A path handed to bwrap is resolved again by
bwrap, following whatever link a program planted there (`work/cache ->
../../Home` would bind the agent's Home writable).
So each folder is opened here one component at a time with O_NOFOLLOW, and
bwrap binds the descriptor (`--bind-fd`): what is bound is what was checked.
A link on any of those paths refuses the call and names it.

Repositories in the write folders are not bound over (v5, issue 23): the
git check (gitcheck.py) notes what git obeys in them before the program
runs and sets aside what the program changed once it ended, so a call's
part costs the same whatever the repositories, and a program may remove one.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

from ..errors import Refused

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LinkOnPath(Refused):
    """Something planted on a path the sandbox binds: a link, or something
    other than a folder.

    `path` is relative to the files folder; the hint says what to do.
    """

    def __init__(self, path: str, what: str, files_path: str):
        self.path, self.what = path, what
        super().__init__(
            f"{path} in the files folder {what}, so the call was refused: a program may have "
            f"planted it to reach past its sandbox",
            f"remove it from outside the sandbox (rm {os.path.join(files_path, path)!r}) and call again")


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
        part: list[str] = []
        # Sorted, so that a folder is bound before a folder inside it (a
        # `[files] write` entry inside work/): the later bind wins.
        for rel in sorted(writable):
            part += ["--bind-fd", str(writable[rel]), f"{files_path}/{rel}"]
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

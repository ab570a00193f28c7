"""Open a folder below a folder's descriptor, one component at a time,
following no link. Cheap to import (stdlib and `errors`, which imports
nothing): serve and every supervisor use it."""

from __future__ import annotations

import errno
import os

from ..errors import Refused

FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MISSING = "does not exist"  # a NotBeneath's `why` when the part is not there


class NotBeneath(Refused):
    """`folder` cannot be entered: `part` is missing, a link, or not a folder.
    The message says which; the caller knows what to do, and says it."""

    def __init__(self, folder: str, part: str, why: str):
        super().__init__(f"folder {folder!r}: {part!r} {why}")
        self.folder, self.part, self.why = folder, part, why


def open_folder(dir_fd: int, folder: str) -> int:
    """A new descriptor of `folder` (relative; "" or "." is `dir_fd` itself)."""
    fd = os.dup(dir_fd)
    try:
        for part in folder.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                raise NotBeneath(folder, part, "goes up")
            try:
                next_fd = os.open(part, FLAGS, dir_fd=fd)
            except OSError as error:
                raise NotBeneath(folder, part, _why(fd, part, error)) from None
            os.close(fd)
            fd = next_fd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _why(parent_fd: int, part: str, error: OSError) -> str:
    if error.errno == errno.ENOENT:
        return MISSING
    try:
        if os.path.islink(f"/proc/self/fd/{parent_fd}/{part}"):
            return "is a link"
    except OSError:
        pass
    if error.errno in (errno.ENOTDIR, errno.ELOOP):
        return "is not a folder"
    return f"cannot be opened ({error.strerror})"

"""The per-call part of the sandbox, called as serve calls it, and what it leaves open."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from linkrun.sandboxing import percall


def open_files(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def call_part(files: Path, write: Sequence[str] = ("work",), folder: str = "") -> tuple[list[str], list[int]]:
    fd = open_files(files)
    try:
        return percall.call_part(fd, str(files), list(write), folder)
    finally:
        os.close(fd)


def close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        os.close(fd)


def refused(files: Path, write: Sequence[str] = ("work",),
            kind: type[Exception] = percall.LinkOnPath) -> Exception:
    """The error the part refuses `files` with; nothing it opened is left open."""
    before = open_fds()
    with pytest.raises(kind) as caught:
        call_part(files, write)
    assert open_fds() == before
    return caught.value

"""Which programs a call may run, and where each one is on the host."""

from __future__ import annotations

import os
import stat

from ..errors import Refused
from .sandboxkey import BINDS_BY_PATH


class Programs:
    """The allowlist of `--program`: bare names found on the programs path,
    absolute paths, or `*` for any of either."""

    def __init__(self, allowed: tuple[str, ...], search_path: str, sandbox: tuple[str, ...] = ()):
        self.any = "*" in allowed
        self.names = tuple(p for p in allowed if p != "*" and not p.startswith("/"))
        self.paths = tuple(p for p in allowed if p.startswith("/"))
        self.search_path = search_path
        self.bound = bound_folders(sandbox)

    def offered(self) -> list[str]:
        """What this machine has of the allowlist, for the instructions."""
        found = [name for name in self.names if self._which(name)]
        found += [path for path in self.paths if _executable(path)]
        return found

    def resolve(self, program: str) -> str:
        """The absolute host path the call runs, or Refused saying what is allowed."""
        if not program or any(c in program for c in "=\0\n"):
            raise Refused(
                f"program {program!r} is not a program name",
                "a program holds no '=', NUL or newline; give a bare name such as python3, "
                "or an absolute path",
            )
        if "/" in program and not program.startswith("/"):
            raise Refused(
                f"program {program!r} is neither a bare name nor an absolute path",
                "give a bare name found on the PATH (such as sh), or an absolute path; to run a "
                "script of the files folder, pass it to its interpreter, such as sh x.sh",
            )
        if program.startswith("/"):
            if program != os.path.normpath(program):
                raise Refused(f"program {program!r} is not a plain absolute path", "give it without '.' or '..'")
            if not _executable(program):
                raise Refused(f"program {program} is not found or not executable", self.allowed_text())
            if program in self.paths or any(self._which(n) == program for n in self.names):
                return program
            if self.any:
                if self.bound is not None and not any(_inside(os.path.realpath(program), b) for b in self.bound):
                    raise Refused(f"program {program} is not visible in the sandbox",
                                  "its folder is not shown inside; run a program of the system folders, "
                                  "or name this one in the sandbox file's [commands] allow")
                return program
            raise Refused(f"program {program} is not allowed", self.allowed_text())
        if not (self.any or program in self.names):
            raise Refused(f"program {program!r} is not allowed", self.allowed_text())
        path = self._which(program)
        if path is None:
            raise Refused(f"program {program!r} is not found on this computer", self.allowed_text())
        return path

    def allowed_text(self) -> str:
        if self.any:
            return "any program on the PATH, or any absolute path to an executable file, may run"
        offered = self.offered()
        if not offered:
            return "no program may run here"
        return "allowed: " + ", ".join(offered)

    def _which(self, name: str) -> str | None:
        return which(name, self.search_path)


def which(name: str, search_path: str) -> str | None:
    """Where a bare name is on a PATH-like list, as a shell finds it.

    Not shutil.which: importing shutil (and the archive modules it loads)
    costs serve's start more than this whole module.
    """
    for folder in search_path.split(os.pathsep):
        if folder:
            path = os.path.join(os.path.abspath(folder), name)
            if _executable(path):
                return path
    return None


def _executable(path: str) -> bool:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISREG(mode) and os.access(path, os.X_OK)


def bound_folders(sandbox: tuple[str, ...]) -> list[str] | None:
    """The host folders a bubblewrap argv shows inside (a bind's source), or
    None for a sandbox that is no bubblewrap (a pass-through shows everything)."""
    if not any(os.path.basename(arg) == "bwrap" for arg in sandbox):
        return None
    return [sandbox[i + 1] for i, arg in enumerate(sandbox[:-2]) if arg in BINDS_BY_PATH]


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")

"""Which programs a call may run, and where each one is on the host.

Where a bare name is found is kept (`_Lookups`) while inotify says that
no folder of the programs path changed: a call then looks its program up
with one read, not a `stat` of each folder in turn.
"""

from __future__ import annotations

import os
import stat
import threading

from ..errors import Refused
from .sandboxkey import BINDS_BY_PATH


class Programs:
    """The allowlist of `--program`: bare names found on the programs path,
    absolute paths, or `*` for any of either."""

    def __init__(self, allowed: tuple[str, ...], search_path: str, sandbox: tuple[str, ...] = (),
                 missing: tuple[str, ...] = (), sandbox_file: str | None = None):
        self.any = "*" in allowed
        self.names = tuple(p for p in allowed if p != "*" and not p.startswith("/"))
        self.paths = tuple(p for p in allowed if p.startswith("/"))
        self.missing = missing  # allowed too, but not on this machine when up looked (--missing-program)
        # Where more are allowed, for a refusal: the agent's sandbox file (serve run by hand knows none).
        self.sandbox_file = sandbox_file or "the agent's sandbox file (Config/sandbox.toml in its folder)"
        self.search_path = search_path
        self._lookups = _Lookups(_folders(search_path))
        self.bound = bound_folders(sandbox)

    def offered(self) -> list[str]:
        """What this machine has of the allowlist, for the instructions (no
        watch started: initialize never waits for it)."""
        found = [name for name in self.names if _found(name, self._lookups.folders)]
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
                "give a bare name found on the PATH (such as sh), or an absolute path" + self._through_sh(program),
            )
        if program.startswith("/"):
            if program != os.path.normpath(program):
                raise Refused(f"program {program!r} is not a plain absolute path", "give it without '.' or '..'")
            if not _executable(program):
                if program in self.paths or program in self.missing:
                    raise self._lacking(program)
                raise Refused(f"program {program} is not found or not executable", self.allowed_text())
            if program in self.paths or any(self._which(n) == program for n in self.names):
                return program
            if self.any:
                if self.bound is not None and not any(_inside(os.path.realpath(program), b) for b in self.bound):
                    raise Refused(f"program {program} is not visible in the sandbox",
                                  "its folder is not shown inside; run a program of the system folders, "
                                  "or name this one in the sandbox file's [commands] allow")
                return program
            raise Refused(f"program {program} is not allowed", self.how_to_allow() + self._through_sh(program))
        if program in self.missing:
            raise self._lacking(repr(program))
        if not (self.any or program in self.names):
            raise Refused(f"program {program!r} is not allowed", self.how_to_allow())
        path = self._which(program)
        if path is None:
            raise self._lacking(repr(program))
        return path

    def _lacking(self, program: str) -> Refused:
        """An allowed program that is not here: said as `doctor` says it, with what to do (not "not allowed")."""
        return Refused(f"program {program} is allowed, but not found on this machine",
                       f"install it, then start the agent again, or run another program; {self.allowed_text()}")

    def _through_sh(self, program: str) -> str:
        """How a program of the files folder (a script, a virtual environment's pip) runs where sh may."""
        if "sh" not in self.names:
            return "; to run a script of the files folder, pass it to its interpreter, such as python3 x.py"
        return (f"; a program of the files folder (a script, a virtual environment's own) runs through sh: "
                f'program sh, args ["-c", "{program} ..."]')

    def how_to_allow(self) -> str:
        """What may run, and how the user allows more."""
        return (f"{self.allowed_text()}; to allow more, add it to [commands] allow in {self.sandbox_file}, "
                "then start the agent again")

    def allowed_text(self) -> str:
        if self.any:
            return "any program on the PATH, or any absolute path to an executable file, may run"
        offered = self.offered()
        if not offered:
            return "no program may run here"
        return "allowed: " + ", ".join(offered)

    def _which(self, name: str) -> str | None:
        return self._lookups.find(name)

    def watch(self) -> None:
        """From now on, keep where each name was found while its folders' watch hears nothing."""
        self._lookups.start()

    def close(self) -> None:
        """At serve's end: the watch of the folders let go."""
        self._lookups.close()




class _Lookups:
    """Bare names → where each was found (None: nowhere), kept once `start`ed
    while a watch of the folders heard nothing; at the first change heard
    all are looked up afresh, under a new watch of the folders as they are
    then. A folder missing is watched through its parent, for its making.
    Before `start`, and where no watch can be had (the inotify limits, a
    folder whose parent is missing too), each look is made afresh, as
    `which` does. What the watch cannot hear: a link in a folder whose
    target elsewhere changed (the call then fails as its program would anywhere)."""

    def __init__(self, folders: tuple[str, ...]) -> None:
        self.folders = folders
        self._found: dict[str, str | None] = {}
        self._watch = -1  # its inotify descriptor; -1: none
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._watch < 0:
                self._watch = _watch(self.folders)

    def find(self, name: str) -> str | None:
        with self._lock:
            if not self._unchanged():
                self._found.clear()
            if name in self._found:
                return self._found[name]
            path = _found(name, self.folders)
            if self._watch >= 0:
                self._found[name] = path
            return path

    def close(self) -> None:
        with self._lock:
            if self._watch >= 0:
                os.close(self._watch)
            self._watch, self._found = -1, {}  # looked up afresh from now on

    def _unchanged(self) -> bool:
        """Nothing heard since the last look (a watch there, and silent)."""
        if self._watch < 0:
            return False
        try:
            os.read(self._watch, 1 << 16)
        except BlockingIOError:
            return True
        os.close(self._watch)  # a change: watched anew, as the folders are now
        self._watch = _watch(self.folders)
        return False


def _watch(folders: tuple[str, ...]) -> int:
    """An inotify descriptor watching `folders` (a missing one through its parent); -1 when none can be had."""
    from .. import kernel  # ctypes: loaded by the first spawn's keyring already

    # What changes where a bare name is found: an entry made, removed, renamed,
    # its mode changed; the folder itself gone.
    changes = (kernel.IN_ATTRIB | kernel.IN_MOVED_FROM | kernel.IN_MOVED_TO | kernel.IN_CREATE | kernel.IN_DELETE
               | kernel.IN_DELETE_SELF | kernel.IN_MOVE_SELF)
    try:
        fd = kernel.inotify("inotify_init1", os.O_NONBLOCK | os.O_CLOEXEC)  # IN_NONBLOCK, IN_CLOEXEC
    except OSError:
        return -1
    try:
        for folder in folders:
            watched = folder if os.path.isdir(folder) else os.path.dirname(folder.rstrip("/"))
            kernel.inotify("inotify_add_watch", fd, os.fsencode(watched), changes)
    except OSError:
        os.close(fd)
        return -1
    return fd


def which(name: str, search_path: str) -> str | None:
    """Where a bare name is on a PATH-like list, as a shell finds it.

    Not shutil.which: importing shutil (and the archive modules it loads)
    costs serve's start more than this whole module.
    """
    return _found(name, _folders(search_path))


def _folders(search_path: str) -> tuple[str, ...]:
    return tuple(os.path.join(os.path.abspath(folder), "") for folder in search_path.split(os.pathsep) if folder)


def _found(name: str, folders: tuple[str, ...]) -> str | None:
    for folder in folders:
        if _executable(folder + name):
            return folder + name
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

"""serve's watch of the host's /etc (inotify), so that a launch refreshes
the agent's /etc view (etcview.py) only after a change, not once a second.

serve's alone, made by the owner of its calls (calls/caller.py) at the
first launch, closed at serve's end; a supervisor looks once a second.
"""

from __future__ import annotations

import errno
import os
import stat
import struct

from .. import logger
from ..kernel import (IN_ATTRIB, IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_DONT_FOLLOW, IN_IGNORED, IN_MODIFY,
                      IN_MOVE_SELF, IN_MOVED_FROM, IN_MOVED_TO, IN_Q_OVERFLOW, inotify)
from .etcview import MASKS, SKIPPED, wanted

# inotify(7), called through ctypes: see EtcWatch.
_WATCHED = (IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
            | IN_MOVE_SELF | IN_DONT_FOLLOW)
_EVENT = struct.Struct("iIII")  # watch descriptor, mask, cookie, the name's length (the name follows)
_USED_UP = {errno.ENOSPC: ("watches", "fs.inotify.max_user_watches"),
            errno.EMFILE: ("instances", "fs.inotify.max_user_instances")}


class EtcWatch:
    """serve's watch of the view's source folder, so that a launch looks at
    the host's entries only when something changed (`heard` past `shown`),
    not once a second. inotify on every folder and file the view shows, read on a
    thread of its own. Files too: a folder hears of a write to a file it
    holds only when made through it, not through a file bound over the entry
    from elsewhere (as container runtimes bind /etc/hosts). What appears is
    watched before its change is marked, so the look that follows the mark
    sees what changed in it meanwhile. The watch starts marked, for what
    changed before it began; a queue overflow counts as a change. When it
    cannot start, or breaks (a watch refused at the inotify limits, the
    folder removed), it says so once on stderr and `watching` turns False:
    launches look once a second again.

    inotify itself rather than watchdog's observer: that one, on a queue
    overflow, logs and tells its handler nothing, and skips a subfolder it
    cannot watch; either would leave the view stale, unseen."""

    def __init__(self, etc: str, fd: int) -> None:
        import threading

        self.etc = etc
        self.watching = True
        self._fd = fd
        self.heard = 1  # changes heard, counted; the first for what changed before the watch began
        self.shown = 0  # the most of them that a finished look began after (set by `refresh`)
        self._lock = threading.Lock()
        self._paths: dict[int, str] = {}  # watch descriptor -> what it watches
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._read, daemon=True, name="etc-watch")

    @classmethod
    def start(cls, etc: str) -> EtcWatch | None:
        """A watch of `etc`, running; None, said on stderr, when inotify cannot cover it."""
        try:
            fd = inotify("inotify_init1", os.O_CLOEXEC)
        except OSError as problem:
            _say_unwatched(etc, problem, "cannot watch")
            return None
        watch = cls(etc, fd)
        try:
            watch._watch("")
        except OSError as problem:
            watch.close()
            _say_unwatched(etc, problem, "cannot watch")
            return None
        watch._thread.start()
        return watch

    def mark(self) -> None:
        """The view may be stale: the next launch looks."""
        with self._lock:
            self.heard += 1

    def close(self) -> None:
        """Stop watching: the thread ended, the descriptors closed."""
        self.watching = False
        if self._thread.is_alive():
            os.write(self._wake_w, b"x")
            self._thread.join()
        for fd in (self._fd, self._wake_r, self._wake_w):
            os.close(fd)

    def _read(self) -> None:
        import select

        try:
            while self._wake_r not in select.select([self._fd, self._wake_r], [], [])[0]:
                self._handle(os.read(self._fd, 1 << 16))
        except OSError as problem:
            _say_unwatched(self.etc, problem, "stopped watching")
        finally:
            self.watching = False  # whatever ended it: launches look once a second again

    def _handle(self, data: bytes) -> None:
        seen, appeared = False, []
        for wd, mask, name in _events(data):
            path = self._paths.get(wd)
            if mask & IN_Q_OVERFLOW:
                seen, appeared = True, [""]  # events lost: watch again whatever is there now
            elif path is None:
                continue
            elif mask & (IN_IGNORED | IN_MOVE_SELF) and path == self.etc:
                raise OSError(errno.ENOENT, "removed or moved", self.etc)
            elif mask & IN_IGNORED:
                del self._paths[wd]
            elif path != self.etc or not name or wanted(name):  # at the top, the entries the list allows
                seen = True
                if mask & (IN_CREATE | IN_MOVED_TO):
                    appeared.append(os.path.relpath(os.path.join(path, name), self.etc))
        for new in appeared:  # before the mark: see the class
            self._watch(new)
        if seen:
            self.mark()

    def _watch(self, rel: str, folder: bool | None = None) -> None:
        """Watch the entry at `rel` ("" for the top) when the view shows it (a
        folder or a file, not a link: its folder's watch hears of it), and all
        it holds; `folder` when known."""
        if rel in MASKS or (rel and "/" not in rel and not wanted(rel)):
            return
        path = os.path.join(self.etc, rel) if rel else self.etc
        try:
            if folder is None:
                mode = os.lstat(path).st_mode
                if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                    return
                folder = stat.S_ISDIR(mode)
            # Watching again (moved, or after an overflow) gives the same descriptor.
            self._paths[inotify("inotify_add_watch", self._fd, os.fsencode(path), _WATCHED)] = path
            if not folder:
                return
            with os.scandir(path) as listing:  # the types of its entries without a stat each: most are links
                held = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in listing
                        if entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False)]
        except OSError as error:
            if error.errno in SKIPPED:
                return  # gone, or replaced: an event of its folder said so
            raise
        for name, is_folder in held:
            self._watch(f"{rel}/{name}" if rel else name, is_folder)


def _events(data: bytes) -> list[tuple[int, int, str]]:
    """The events of one read: (watch descriptor, mask, name)."""
    found, at = [], 0
    while at < len(data):
        wd, mask, _, length = _EVENT.unpack_from(data, at)
        at += _EVENT.size
        found.append((wd, mask, os.fsdecode(data[at:at + length].rstrip(b"\0"))))
        at += length
    return found


def _say_unwatched(etc: str, problem: OSError, what: str) -> None:
    if problem.errno in _USED_UP:
        kind, limit = _USED_UP[problem.errno]
        why = f"the inotify {kind} allowed to this user are used up: raise the limit {limit} with sysctl"
    else:
        why = str(problem)
    logger.warning(f"{what} {etc} for changes ({why}); each call looks at it once a second instead")

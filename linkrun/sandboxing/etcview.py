"""The sandbox's /etc: one prepared folder per agent, bound read-only (DESIGN.md §6).

/etc also holds the machine's secrets (shadow, ssh host keys, ssl/private,
network passwords), readable by a program that runs as root, as it does
when the user is root: the sandbox shows an allow list of its entries, and
no more. Bound entry by entry, the list cost bwrap some fifty mounts, each
remounted read-only after a read of the whole mount table: most of a
call's time. So the allowed entries are copied into a view in the state
folder (files copied, links kept as links, folders copied, modes kept, the
masks left out, and only what etcrule.py allows: what everyone on the host
may read, no private key), and each sandbox binds that one folder as its /etc.

In the state folder (names in records.py): `ETC_VIEWS/<name>` the views,
each beside `<name>.print` (what it was copied from: the source folder, the
boot, and every entry's lstat); `ETC_VIEW`, a link to the current view;
`ETC_LOCK`, held by whoever rebuilds, its mtime the time of the last check.

Refreshed (`refresh`, before each launch): the allowed entries are lstat'ed
and compared with the current view's print, in serve only when its watch
of the host's folder (etcwatch.py, inotify) saw a change since the last
look; elsewhere, or when the watch cannot run, at most once a second, for
all the agent's processes together. On a difference a new view is
copied beside it and the link swapped by a rename, so a launch sees the old
view or the new, never one half made. The rebuild holds `ETC_LOCK`: two
serves of one agent never build at once, and the second finds it current.

A launch binds the view by a descriptor it holds, with a shared flock,
until its sandbox ended (`pin`). An old view is removed only under its
exclusive flock, taken without waiting, so never under a running sandbox
(a bind shows its folder itself: a file removed there is gone inside).

stdlib only (and records, filing, etcrule): serve and the supervisor import it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import os
import stat
import time

from .. import logger
from ..state import filing
from . import etcrule
from ..errors import LinkRunError
from ..state.layout import ETC_LOCK, ETC_VIEW, ETC_VIEWS

ETC = "/etc"
# What programs need of /etc, and no more.
NAMES = (
    "alternatives", "bash.bashrc", "ca-certificates", "ca-certificates.conf", "crypto-policies",
    "debian_version", "ethertypes", "fonts", "gai.conf", "gitconfig", "group", "host.conf",
    "hostname", "hosts", "inputrc", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
    "locale.alias", "locale.conf", "localtime", "lsb-release", "magic", "magic.mime",
    "mailcap", "manpath.config", "mime.types", "mtab", "nanorc", "networks", "npmrc",
    "nsswitch.conf", "os-release", "passwd", "perl", "pip.conf", "pki", "profile",
    "protocols", "redhat-release", "resolv.conf", "rpc", "services", "sgml", "shells", "ssl",
    "system-release", "terminfo", "timezone", "vim", "wgetrc", "xml",
)
PATTERNS = ("java-*", "python3*", "ImageMagick-*", "*-release")
MASKS = ("ssl/private", "pki/tls/private")  # the host's private keys, inside folders allowed above: never copied
CHECK_EVERY = 1.0  # seconds between two looks at the host's entries
SKIPPED = (errno.ENOENT, errno.EACCES, errno.EPERM, errno.ELOOP, errno.ENOTDIR)  # gone, unreadable, replaced

RACY = 50_000_000  # ns: a change this close before a look may be followed, unseen, by another in the same tick
Entries = list[tuple[str, os.stat_result | None]]  # None: a link below the top, seen through its folder
Print = tuple[int, bytes]  # when the look began (ns), and the fingerprint it saw
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    class Heard(Protocol):
        """What `refresh` reads of a watch of the host's /etc (serve's alone: etcwatch.EtcWatch)."""

        watching: bool
        heard: int  # changes heard, counted
        shown: int  # the most of them that a finished look began after (set by `refresh`)

_prints: dict[str, Print] = {}  # a view's path → its print, read once by this process


def wanted(name: str) -> bool:
    """Whether the list allows a top-level entry of /etc."""
    return name in NAMES or any(fnmatch.fnmatchcase(name, p) for p in PATTERNS)


def entries(etc: str = ETC) -> Entries:
    """Each allowed entry below `etc` (relative path, lstat), a folder before
    what it holds; never following a link, the masks and what this user
    cannot list left out. A link below the top is not lstat'ed: a link
    cannot change in place, and adding, replacing or removing one changes
    its folder's mtime (there are some 700: most of the look's time)."""
    found: Entries = []
    try:
        names = sorted(os.listdir(etc))
    except FileNotFoundError:
        return found
    for name in names:
        if wanted(name):
            try:
                _walk(etc, name, os.lstat(os.path.join(etc, name)), found)
            except OSError as error:
                if error.errno not in SKIPPED:
                    raise
    return found


def _walk(etc: str, rel: str, info: os.stat_result, found: Entries) -> None:
    if rel in MASKS or not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
        return
    if not stat.S_ISDIR(info.st_mode):
        found.append((rel, info))
        return
    try:
        with os.scandir(os.path.join(etc, rel)) as listing:
            children = sorted(listing, key=lambda entry: entry.name)
        found.append((rel, info))
        for child in children:
            if child.is_symlink():
                found.append((f"{rel}/{child.name}", None))
            else:
                _walk(etc, f"{rel}/{child.name}", child.stat(follow_symlinks=False), found)
    except OSError as error:
        if error.errno not in SKIPPED:
            raise


def fingerprint(etc: str, found: Entries) -> bytes:
    """What a view copied from `found` shows: a changed, added or removed
    entry changes it (a write changes a file's ctime, a rename its inode),
    and so does a reboot (a copy not yet on disk may have been lost)."""
    from ..state.records import boot_id  # here: up's first answer needs this module, and no record

    lines = [f"{etc}\0{boot_id()}\0{etcrule.RULE}"] + [
        f"{rel}\0link" if info is None else
        f"{rel}\0{info.st_mode:o}\0{info.st_ino}\0{info.st_size}\0{info.st_mtime_ns}\0{info.st_ctime_ns}"
        for rel, info in found]
    return "\n".join(lines).encode("utf-8", "surrogateescape")


def _racy(found: Entries, looked_at: int) -> bool:
    """Whether an entry changed so close before the look that made a view
    that a second change in the same clock tick would not show in its
    times: such a view is made again once (git's "racy" files)."""
    return any(info is not None and abs(info.st_ctime_ns - looked_at) <= RACY for _, info in found)


def _stale(current: Print | None, made: bytes, found: Entries) -> bool:
    return current is None or current[1] != made or _racy(found, current[0])


def link_of(state: str) -> str:
    return os.path.join(state, ETC_VIEW)


def ensure(state: str, etc: str = ETC) -> None:
    """Make the view of `etc` current (copied anew when its entries changed
    or it has none), and remove the old views no sandbox holds."""
    with filing.hold(os.path.join(state, ETC_LOCK)) as lock:
        _make_current(state, etc, lock)


def made_current(state: str) -> None:
    """`ensure` for up's checks, doctor and `sandbox`: a folder it cannot write
    (an agent's folder made read-only, a full disk) said as what to mend."""
    try:
        ensure(state)
    except OSError as error:
        from ..errors import LinkRunError

        where = f" ({error.filename})" if error.filename else ""
        raise LinkRunError(f"cannot write the agent's state folder {state}{where}: {error.strerror or error}",
                           "the agent's folder must be writable by the user the agent runs as: make it so "
                           "(chmod -R u+w), or give another --agent") from None


def _make_current(state: str, etc: str, lock: int) -> None:  # under ETC_LOCK, `lock` its descriptor
    os.utime(lock)  # checked now
    looked_at = time.time_ns()
    found = entries(etc)
    made = fingerprint(etc, found)
    if _stale(_print_of(state), made, found):
        _swap_in(state, _copy(etc, found, (looked_at, made), os.path.join(state, ETC_VIEWS)))
    _remove_old(state)


# Each state folder as this process first found it: one made again since (by a call's kept output, after
# `remove`) is not the agent's, and no view is rebuilt into it.
_STATES: dict[str, tuple[int, int] | None] = {}


def same_state(link: str) -> None:
    """Raises LinkRunError, saying to start the agent again, when the state
    folder of the view `link` is gone, or is another than this process first
    found: `remove` beside a running serve, where "try again" never mends it."""
    state = os.path.dirname(link)
    try:
        info = os.stat(state)
        now: tuple[int, int] | None = (info.st_dev, info.st_ino)
    except FileNotFoundError:
        now = None
    if now is None or _STATES.setdefault(state, now) != now:
        raise LinkRunError(f"the agent's state folder {state} is gone: `lnk-link-run remove` removed it, or it "
                           "was deleted", "start the agent again (in most clients, restart its server): up "
                           "makes it afresh")


def refresh(link: str, watch: Heard | None = None) -> None:
    """Before a launch: rebuild the view when the host's entries changed
    since it was made. With a `watch` that runs, when it heard a change no
    finished look began after, under ETC_LOCK: a launch that comes while
    another looks or copies waits for it, and binds the view that shows the
    change. Without one, at most once every CHECK_EVERY seconds. A failed
    rebuild keeps the current view and says why on stderr; the next tries again."""
    same_state(link)
    state, watched = os.path.dirname(link), watch if watch is not None and watch.watching else None
    lock = os.path.join(state, ETC_LOCK)
    if (watched.shown == watched.heard) if watched else _looked_lately(lock):
        return
    try:
        if watched:
            heard = watched.heard  # before the look: what is heard after it, the next launch looks at
            with filing.hold(lock) as held:
                if watched.shown < heard:
                    _make_current(state, _source(_print_of(state)), held)
                    watched.shown = max(watched.shown, heard)
            return
        with contextlib.suppress(FileNotFoundError):  # none yet: the rebuild makes it
            os.utime(lock)  # the others need not look too
        current = _print_of(state)
        etc = _source(current)
        found = entries(etc)
        if _stale(current, fingerprint(etc, found), found):
            ensure(state, etc)
    except OSError as error:
        logger.warning(f"cannot refresh the sandbox's /etc view in {state}: {error}; calls keep the current one")


def _looked_lately(lock: str) -> bool:
    """Whether someone looked at the host's entries less than CHECK_EVERY seconds ago."""
    with contextlib.suppress(FileNotFoundError):
        return time.time() - os.stat(lock).st_mtime < CHECK_EVERY
    return False


def source_of(link: str) -> str:
    """The folder the current view was copied from (the host's /etc, or a stand-in)."""
    return _source(_print_of(os.path.dirname(link)))


def _source(current: Print | None) -> str:
    return current[1].split(b"\0", 1)[0].decode("utf-8", "surrogateescape") if current else ETC


def pin(link: str) -> int:
    """A descriptor of the current view, holding it (a shared flock) until
    closed: bound by bwrap, it is never removed under the sandbox."""
    for _ in range(16):
        fd = os.open(link, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits while a remover takes it apart
        held = os.fstat(fd)
        try:
            now = os.stat(link)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)  # swapped meanwhile: take the new one
    raise LinkRunError(f"the sandbox's /etc view {link} kept changing under the call",
                       "call again; if it keeps failing, start the agent again with lnk-link-run up")


def _print_of(state: str) -> Print | None:
    """The current view's print, or None when there is no view."""
    link = link_of(state)
    try:
        view = os.path.join(state, os.readlink(link))
    except FileNotFoundError:
        return None
    if view not in _prints:
        try:
            with open(f"{view}.print", "rb") as f:
                looked_at, _, made = f.read().partition(b"\n")
            _prints[view] = (int(looked_at), made)
        except (FileNotFoundError, ValueError):
            return None  # none, or cut short: made again
    return _prints[view]


def _copy(etc: str, found: Entries, made: Print, views: str) -> str:
    """A new view of `found` in `views`, with its print beside it: the view's name, relative to the state folder."""
    os.makedirs(views, 0o700, exist_ok=True)
    name = os.urandom(6).hex()
    view = os.path.join(views, name)
    os.mkdir(view, 0o700)  # opened to its mode once whole
    folders: list[tuple[str, os.stat_result]] = [(view, os.stat(etc))]
    left_out: tuple[str, ...] = ()  # folders the rule leaves out, with all they hold
    for rel, info in found:
        source, target = os.path.join(etc, rel), os.path.join(view, rel)
        if rel.startswith(left_out) or not etcrule.shown(info):
            left_out += (f"{rel}/",)
            continue
        try:
            if info is None or stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(source), target)
            elif stat.S_ISDIR(info.st_mode):
                os.mkdir(target, 0o700)
                folders.append((target, info))
            else:
                etcrule.copy_file(source, target, info)
        except OSError as error:
            if error.errno not in SKIPPED:
                raise
    for folder, info in reversed(folders):  # deepest first: a folder without write permission is filled already
        os.chmod(folder, stat.S_IMODE(info.st_mode), follow_symlinks=False)
    # Not synced, nor the view: a crash before they reach the disk is followed
    # by a reboot, and a print names its boot.
    with open(os.open(f"{view}.print", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), "wb") as f:
        f.write(b"%d\n" % made[0] + made[1])
    return os.path.join(ETC_VIEWS, name)


def _swap_in(state: str, view: str) -> None:
    """The link names `view` now, in one rename."""
    beside = f"{link_of(state)}.{os.urandom(4).hex()}.tmp"
    os.symlink(view, beside)
    os.rename(beside, link_of(state))


def _remove_old(state: str) -> None:
    """Remove each view but the current one that no sandbox holds, its print,
    and what a rebuild cut short left (under ETC_LOCK: nothing is being built)."""
    views = os.path.join(state, ETC_VIEWS)
    try:
        current = os.path.basename(os.readlink(link_of(state)))
        names = os.listdir(views)
    except FileNotFoundError:
        return
    for name in names:
        if name in (current, f"{current}.print") or name.endswith(".print"):
            continue
        _remove_unheld(os.path.join(views, name))
    for name in os.listdir(views):
        if name.endswith(".print") and not os.path.isdir(os.path.join(views, name[:-6])):
            os.unlink(os.path.join(views, name))
    for name in os.listdir(state):  # links a swap cut short left
        if name.startswith(f"{ETC_VIEW}.") and name.endswith(".tmp"):
            os.unlink(os.path.join(state, name))


def _remove_unheld(view: str) -> None:
    fd = os.open(view, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return  # a sandbox shows it: removed by a later rebuild
    try:
        _remove_tree(view)
        _prints.pop(view, None)
    finally:
        os.close(fd)


def _remove_tree(path: str) -> None:
    os.chmod(path, 0o700)  # a copied folder may have no write permission
    with os.scandir(path) as found:
        for entry in found:
            if entry.is_dir(follow_symlinks=False):
                _remove_tree(entry.path)
            else:
                os.unlink(entry.path)
    os.rmdir(path)

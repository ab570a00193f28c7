"""The kept output of calls: `<state>/kept/`, outside every sandbox.

A `command` call whose answer cut a stream keeps that stream's last bytes
(keeper.py writes them) under an id of its own, `<call id>-output` or
`<call id>-errors`: `<id>.out` holds the bytes [kept_from, total) of the
stream, as a background command's output file does, and `<id>.json` its
owner (the call's conversation), its sizes and when it was kept. The json
is written last: a file without one is a call in flight, or one a killed
serve left (removed once it is older than the longest call and the keeping
time together).

Each item is read by its conversation alone: another's id, an expired one,
or one of the wrong form is answered as an unknown id (the last without
touching the disk). Items expire `keep_for` after they were kept, and the
agent's items together stay within `total` bytes, the oldest removed first;
both are applied after each call that keeps something and at serve's start
(an idle serve does nothing), and a read never serves an expired item.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from .. import logger
from ..config import KeepSettings
from ..state import layout, records
from ..detached.outread import Look, ReadChunk, read_at
from ..errors import Refused
from ..messages.conversation import conversation
from ..processes.keeper import Keeper
from ..processes.runner import Outcome

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Final

    from ..state.records import KeptItem

FOLDER = layout.KEPT
STREAMS = ("output", "errors")
ID = re.compile(r"[a-z2-7]{16}-(?:output|errors)")  # matched whole (fullmatch)
URI_PREFIX = "linkrun://kept/"
RESOURCE_MAX = 4 * 1024 * 1024  # a resources/read gives at most the last this many bytes
STATE: Final = "kept"  # a kept item's state, as read shows it


KEPT_SCHEMA = {f"{stream}_id": {"type": "string", "description": (
    f"Only when its {stream} was cut and kept whole: the id that read reads all of it by (its last bytes past "
    f"the keeping cap), as the [… N bytes left out …] line says.")} for stream in ("output", "errors")}


def kept_links(kept: KeptStreams | None) -> list[dict[str, object]]:
    """A resource_link for each kept stream (kept.py serves them with resources/read)."""
    if kept is None:
        return []
    return [{"type": "resource_link", "uri": URI_PREFIX + kept_id, "name": kept_id, "mimeType": "text/plain",
             "description": f"The call's {stream}, kept whole past its answer's start and end (its last bytes)"}
            for stream, kept_id in kept.ids.items()]


def is_kept_id(value: object) -> bool:
    return isinstance(value, str) and ID.fullmatch(value) is not None


@dataclass(frozen=True)
class KeptStreams:
    """What a call kept: each cut stream's id ("output", "errors" → id), and the cap each was kept to."""

    ids: dict[str, str]
    cap: int
    keep_for: int  # seconds


@dataclass
class Keeping:
    """One call's keepers, made before it runs; settled after."""

    call_id: str
    thread: str
    keepers: tuple[Keeper, Keeper]


class Kept:
    """The agent's kept output, for one serve: its settings and the open folder."""

    def __init__(self, settings: KeepSettings, way_in: bool, longest: float) -> None:
        self.settings = settings
        self.way_in = way_in  # the conversation rules of background commands (conversation.py)
        self.longest = longest  # the longest a call runs: a file younger than this may be in flight
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._pruned = False  # the first call that may keep something prunes what earlier serves kept

    # -- the folder ----------------------------------------------------------------

    def folder(self) -> int:
        """`<state>/kept/`, made 0700 at the first use, opened without following a link."""
        with self._lock:
            if self._fd is None:
                state = self.settings.state
                os.makedirs(state, 0o700, exist_ok=True)
                try:
                    os.mkdir(os.path.join(state, FOLDER), 0o700)
                except FileExistsError:
                    pass
                self._fd = os.open(os.path.join(state, FOLDER),
                                   os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            return self._fd

    def owner(self, meta: dict[str, Any]) -> str | None:
        """The call's conversation, or None when it has none (a harness with a way in that names none)."""
        try:
            return conversation(meta, self.way_in)[0]
        except Refused:
            return None

    # -- keeping ---------------------------------------------------------------------

    def begin(self, meta: dict[str, Any]) -> Keeping | None:
        """Keepers for a call of this conversation; None when nothing can be kept for it."""
        thread = self.owner(meta)
        if thread is None:
            return None
        try:
            folder = self.folder()
        except OSError as error:
            print(f"lnk-link-run serve: cannot keep calls' output in {self.settings.state}: {error}",
                  file=sys.stderr, flush=True)
            return None
        if not self._pruned:  # off the call's path: the first answer never waits for it
            self._pruned = True
            threading.Thread(target=self.prune, daemon=True, name="kept").start()
        call_id = records.new_id()
        keepers = (Keeper(folder, f"{call_id}-output.out", self.settings.output),
                   Keeper(folder, f"{call_id}-errors.out", self.settings.output))
        return Keeping(call_id, thread, keepers)

    def settle_call(self, keeping: Keeping, outcome: Outcome, arguments: dict[str, Any]) -> KeptStreams:
        """A call's kept streams → their ids; nothing is kept of a cancelled call (nor of one that
        failed: the runner removed its files)."""
        wanted = not outcome.cancelled
        cut = (wanted and outcome.output.left_out > 0, wanted and outcome.errors.left_out > 0)
        ids = self.settle(keeping, cut, str(arguments["program"]), tuple(map(str, arguments.get("args") or ())))
        return KeptStreams(ids, self.settings.output, self.settings.keep_for)

    def settle(self, keeping: Keeping, cut: tuple[bool, bool], program: str, args: tuple[str, ...]) -> dict[str, str]:
        """Each stream that was cut and kept whole → its id; the rest removed. Then the caps."""
        ids: dict[str, str] = {}
        for stream, keeper, wanted in zip(STREAMS, keeping.keepers, cut, strict=True):
            placed = keeper.finish(wanted)
            if placed is None:
                continue
            kept_id = f"{keeping.call_id}-{stream}"
            kept_from, size = placed
            about = {"v": 1, "id": kept_id, "thread": keeping.thread, "program": program, "args": list(args),
                     "kept_from": kept_from, "total": kept_from + size, "at": time.time()}
            try:
                self._write_about(kept_id, about)
            except OSError as error:
                logger.warning(f"cannot keep a call's output: {error}")
                keeper.remove()
                continue
            ids[stream] = kept_id
        if ids:
            self.prune()
        return ids

    def _write_about(self, kept_id: str, about: dict[str, Any]) -> None:
        """Written beside and renamed: whole or not at all (not synced: a cache, lost with a crash)."""
        folder = self.folder()
        temporary = f"{kept_id}.json.{os.urandom(4).hex()}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=folder)
        try:
            os.write(fd, orjson.dumps(about))
        finally:
            os.close(fd)
        os.rename(temporary, f"{kept_id}.json", src_dir_fd=folder, dst_dir_fd=folder)

    # -- the caps ----------------------------------------------------------------------

    def prune(self) -> None:
        """Expired items removed, then the oldest until the rest fit in the total; and what a killed serve left."""
        try:
            folder = self.folder()
            items, strays = self._scan(folder)
        except OSError as error:
            logger.warning(f"cannot look over the kept output: {error}")
            return
        now = time.time()
        items.sort(key=lambda item: item[1])  # oldest first
        total = sum(size for _, _, size in items)
        for kept_id, at, size in items:
            if min(at, now) + self.settings.keep_for > now and total <= self.settings.total:
                continue
            self._remove(folder, kept_id)
            total -= size
        for name in strays:
            _unlink(folder, name)

    def _scan(self, folder: int) -> tuple[list[tuple[str, float, int]], list[str]]:
        """(id, kept at, size) of each item; and the names of files no item owns that are old enough to go."""
        names = set(os.listdir(folder))
        items = []
        for name in names:
            if name.endswith(".json") and is_kept_id(name[:-5]):
                kept_id = name[:-5]
                about = _load(folder, name)
                at = about.get("at") if about else None
                size = _size(folder, f"{kept_id}.out")
                items.append((kept_id, at if isinstance(at, (int, float)) else 0.0, size))
        owned = {f"{kept_id}.{suffix}" for kept_id, _, _ in items for suffix in ("json", "out")}
        old = time.time() - self.settings.keep_for - self.longest - 60
        strays = [name for name in names - owned if _mtime(folder, name) < old]
        return items, strays

    def _remove(self, folder: int, kept_id: str) -> None:
        for suffix in (".json", ".out"):  # the json first: a reader never finds an item without its bytes
            _unlink(folder, kept_id + suffix)

    # -- reading -------------------------------------------------------------------------

    def read(self, kept_id: object, meta: dict[str, Any], offset: int | None, limit: int) -> ReadChunk:
        """At most `limit` bytes of this conversation's item from `offset` (none: its last bytes)."""
        with self.opened(kept_id, meta) as look:
            return read_at(look, offset, limit)

    def resource(self, uri: str, meta: dict[str, Any]) -> str | None:
        """A resource link's text (its last RESOURCE_MAX bytes); None when this conversation has no such item."""
        kept_id = uri[len(URI_PREFIX):] if uri.startswith(URI_PREFIX) else ""
        try:
            with self.opened(kept_id, meta) as look:
                return read_at(look, None, RESOURCE_MAX).data.decode("utf-8", errors="replace")
        except Refused:
            return None

    @contextlib.contextmanager
    def opened(self, kept_id: object, meta: dict[str, Any]) -> Iterator[Look]:
        """The item's Look (look), its file closed after."""
        look = self.look(kept_id, meta)
        try:
            yield look
        finally:
            if look.fd is not None:
                os.close(look.fd)

    def look(self, kept_id: object, meta: dict[str, Any]) -> Look:
        """The item's file, open, as a Look (the caller closes it); Refused as an unknown id when it is not
        this conversation's, expired, or of the wrong form (never touching the disk for the last)."""
        from ..units import format_duration

        unknown = Refused(f"no kept output of this conversation's has id {kept_id!r}",
                          f"give the id that one of its command answers named, within "
                          f"{format_duration(self.settings.keep_for)} of that call")
        thread = self.owner(meta)
        if thread is None or not is_kept_id(kept_id):
            raise unknown
        assert isinstance(kept_id, str)  # is_kept_id
        folder = self.folder()
        about = _load(folder, f"{kept_id}.json")
        if not about or about.get("thread") != thread:
            raise unknown
        at = about.get("at")
        if not isinstance(at, (int, float)) or min(at, time.time()) + self.settings.keep_for <= time.time():
            self._remove(folder, kept_id)
            raise unknown
        try:
            fd = os.open(f"{kept_id}.out", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        except FileNotFoundError:
            raise unknown from None
        size = os.fstat(fd).st_size
        record: KeptItem = {"id": kept_id, "state": STATE, "program": about.get("program"), "args": about.get("args")}
        return Look(fd, size, record, int(about.get("kept_from") or 0))


def _load(folder: int, name: str) -> dict[str, Any] | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        return None
    try:
        data = b"".join(_chunks(fd))
    finally:
        os.close(fd)
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _chunks(fd: int) -> Iterator[bytes]:
    while chunk := os.read(fd, 65536):
        yield chunk


def _size(folder: int, name: str) -> int:
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=False).st_size
    except OSError:
        return 0


def _mtime(folder: int, name: str) -> float:
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=False).st_mtime
    except OSError:
        return time.time()


def _unlink(folder: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        pass

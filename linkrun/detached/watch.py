"""File watches, and the one module that imports watchdog: serve's Watcher,
for the reads and stops that wait, and the supervisor's watch of its stop file.

watchdog loads only when a watch starts, so serve's start, and a supervisor's
steps before its program runs, never pay for it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from .. import logger

if TYPE_CHECKING:
    from watchdog.events import FileSystemEvent
    from watchdog.observers.api import BaseObserver


def watch_paths(folder: str, paths: tuple[str, ...], wake: Callable[[], None]) -> BaseObserver:
    """An observer, started, that calls `wake` on any event on one of `paths`
    (files of `folder`); OSError when inotify ran out."""
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    changes = _changes()

    class StopFileHandler(FileSystemEventHandler):
        def on_any_event(self, event: FileSystemEvent) -> None:
            if type(event) in changes and (event.src_path in paths or event.dest_path in paths):
                wake()

    observer = Observer()
    # Changes only: every read of any record opens a file here, and would wake us.
    observer.schedule(StopFileHandler(), folder, recursive=False, event_filter=changes)
    observer.daemon = True
    observer.start()
    return observer


def _changes() -> list[type[FileSystemEvent]]:
    """The events that change a file (a write, a rename, a new or removed file), never a mere open or read."""
    from watchdog.events import FileClosedEvent, FileCreatedEvent, FileDeletedEvent, FileModifiedEvent, FileMovedEvent

    return [FileCreatedEvent, FileDeletedEvent, FileModifiedEvent, FileMovedEvent, FileClosedEvent]


class Watcher:
    """serve's one watch of the state folder and background/, for every read
    and stop that waits. It runs only while someone waits, and wakes a waiter
    only on a change to its own command's files (a write, a rename, a new or
    removed file), never on a mere open or read: an idle server, and a waiting
    one, use no CPU."""

    def __init__(self, folders: tuple[str, ...]):
        self.folders = folders
        self.condition = threading.Condition()
        self.counts: dict[str, int] = {}  # command id -> changes to its files seen while watching
        self.waiters = 0
        self.observer: BaseObserver | None = None

    @contextlib.contextmanager
    def watching(self, wanted: bool) -> Iterator[None]:
        """The watch runs while the block does, when `wanted`."""
        if not wanted:
            yield
            return
        self._join()
        try:
            yield
        finally:
            self._leave()

    def _join(self) -> None:
        with self.condition:
            self.waiters += 1
            if self.observer is None:
                self.observer = self._start()

    def _leave(self) -> None:
        with self.condition:
            self.waiters -= 1
            observer = self.observer if self.waiters == 0 else None
            if self.waiters == 0:
                self.observer = None
                self.counts.clear()  # nobody holds a count any more
        if observer:
            observer.stop()

    def _start(self) -> BaseObserver | None:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        watcher = self
        changes = _changes()

        class ChangeHandler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                if type(event) in changes:  # the filter below keeps the kernel from sending the rest
                    watcher._changed(event.src_path, event.dest_path)

        observer = Observer()
        observer.daemon = True
        try:
            for folder in self.folders:
                observer.schedule(ChangeHandler(), folder, recursive=False, event_filter=changes)
            observer.start()
        except OSError as problem:  # inotify exhausted: the waits fall back to their slices
            logger.warning(f"cannot watch for output ({problem}); reads that wait check every second")
            return None
        return observer

    def _changed(self, *paths: str | bytes) -> None:
        # <id>.out, <id>.json, <id>.json.<hex>.tmp, <id>.stop, ...: the id is the name up to its first dot.
        ids = {os.fsdecode(os.path.basename(p)).split(".", 1)[0] for p in paths if p}
        with self.condition:
            for command_id in ids:
                self.counts[command_id] = self.counts.get(command_id, 0) + 1
            self.condition.notify_all()

    def changes(self, command_id: str) -> int:
        """How many changes to this command's files were seen: give it to `wait_change`."""
        with self.condition:
            return self.counts.get(command_id, 0)

    def wait_change(self, command_id: str, seen: int, timeout: float) -> None:
        """Until a change to the command's files after `seen`, or `timeout` seconds."""
        with self.condition:
            self.condition.wait_for(lambda: self.counts.get(command_id, 0) != seen, max(0.0, timeout))

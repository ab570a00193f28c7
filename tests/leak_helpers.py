"""The leak check: a test fails if it leaves a process, a descriptor or a thread behind.

Processes: while a test runs, `LNK_TEST=<its marker>` is in the worker's
environment and `clean_env()` passes it on, so every process the test starts
carries it, double-forked ones too. A process still carrying it once the test's
fixtures tore down gets a grace to end (a proxy after its last user, a
supervisor after its stop), then is killed and named. Programs inside
bubblewrap start with an empty environment and are not seen: their sandbox
dies with its init.

Descriptors and threads: the worker's own, after the test against before it,
less what a fixture of a broader scope opened (it outlives the test by design).

conftest.py loads this module as a plugin; its fixture is the first a test sets
up, so it tears down last.
"""

from __future__ import annotations

import gc
import hashlib
import os
import signal
import threading
from collections.abc import Iterator

import pytest

MARKER = "LNK_TEST"
GRACE = 10.0  # seconds a leftover has to end by itself before it is killed

# What fixtures broader than a test opened: theirs to close, not a test's leak.
_kept_fds: set[str] = set()
_kept_threads: set[threading.Thread] = set()


def marker_env() -> dict[str, str]:
    """The running test's marker, for an environment a test builds by hand."""
    return {MARKER: os.environ[MARKER]} if MARKER in os.environ else {}


def marker_of(nodeid: str) -> str:
    return hashlib.sha256(f"{os.getpid()} {nodeid}".encode()).hexdigest()[:16]


def marked(marker: str) -> dict[int, str]:
    """pid → command line of every other live process whose environment holds the marker."""
    needle = f"\0{MARKER}={marker}\0".encode()
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle not in b"\0" + f.read():  # a zombie's reads empty
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                found[int(name)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # ended while we looked
            pass
    return found


def open_fds() -> dict[str, str]:
    """fd → what it points at, of this process."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the listing's own descriptor
            pass
    return fds


def leftovers(marker: str, fds: dict[str, str], threads: set[threading.Thread]) -> list[str]:
    """What the test left behind, one line each."""
    gc.collect()  # a file object dropped but not yet collected is not a leak
    lines = [f"process {pid}: {command}" for pid, command in marked(marker).items()]
    lines += [f"descriptor {fd} → {target}" for fd, target in open_fds().items()
              if fd not in fds and fd not in _kept_fds]
    lines += [f"thread {thread.name!r}" for thread in threading.enumerate()
              if thread not in threads and thread not in _kept_threads]
    return lines


def kill_marked(marker: str) -> None:
    """SIGKILL what carries the marker until nothing does (a dying parent may fork once more)."""
    while left := marked(marker):
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(autouse=True)
def leak_check(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test if a process, descriptor or thread it made outlives its fixtures."""
    from conftest import wait_for  # here: conftest imports this module

    marker = marker_of(request.node.nodeid)
    fds, threads = open_fds(), set(threading.enumerate())
    outer = os.environ.get(MARKER)
    os.environ[MARKER] = marker
    try:
        yield
    finally:
        _restore(outer)
    try:
        wait_for(lambda: not leftovers(marker, fds, threads), timeout=GRACE, interval=0.05, what="leftovers")
        return
    except AssertionError:
        left = leftovers(marker, fds, threads)
        kill_marked(marker)
    if left:
        pytest.fail("the test left behind (processes now killed):\n  " + "\n  ".join(left), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> Iterator[object]:
    """A broader fixture set up within a test is not the test's: its processes carry no
    marker, and its descriptors and threads are kept out of the check."""
    if fixturedef.scope == "function":
        return (yield)
    outer = os.environ.pop(MARKER, None)
    fds, threads = open_fds(), set(threading.enumerate())
    try:
        return (yield)
    finally:
        _restore(outer)
        _kept_fds.update(set(open_fds()) - set(fds))
        _kept_threads.update(set(threading.enumerate()) - threads)


def _restore(value: str | None) -> None:
    if value is None:
        os.environ.pop(MARKER, None)
    else:
        os.environ[MARKER] = value

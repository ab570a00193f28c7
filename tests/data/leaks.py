"""Tests the leak check must fail or pass, run by tests/test_leak_check.py in a pytest of their own."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator

import pytest

LEFT: list[int] = []  # kept, so that no collection closes them


def test_leaves_a_process_a_descriptor_and_a_thread() -> None:
    # Double-forked: sh exits at once, and its child is no child of ours.
    subprocess.run(["sh", "-c", f"python3 -c 'import time; time.sleep(300)' {os.environ['LEAK_TOKEN']} &"],
                   check=True)
    LEFT.append(os.open("/dev/null", os.O_RDONLY))
    threading.Thread(target=threading.Event().wait, name="left-waiting", daemon=True).start()


def test_a_process_that_ends_within_the_grace_is_no_leak() -> None:
    subprocess.run(["sh", "-c", "sleep 1 &"], check=True)


@pytest.fixture(scope="module")
def shared() -> Iterator[int]:
    """Like a shared site: a descriptor and a thread that outlive each test using them."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="shared-waiting")
    thread.start()
    fd = os.open("/dev/null", os.O_RDONLY)
    yield fd
    os.close(fd)
    stop.set()
    thread.join()


def test_a_module_fixture_is_not_a_leak(shared: int) -> None:
    assert os.fstat(shared)


def test_a_module_fixture_is_not_a_leak_of_the_next_test_either(shared: int) -> None:
    assert os.fstat(shared)

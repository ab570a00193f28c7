"""The leak check itself: a pytest of its own runs tests/data/leaks.py and must
fail the test that leaves things behind, and only that one."""

from __future__ import annotations

import re
import secrets
import subprocess

import pytest
from conftest import PYTHON, REPO, clean_env
from up_harness import processes_with


@pytest.mark.timeout(180)
def test_a_test_that_leaves_a_process_a_descriptor_or_a_thread_fails_and_its_process_is_killed() -> None:
    token = f"lnk-leak-{secrets.token_hex(8)}"
    done = subprocess.run([PYTHON, "-m", "pytest", "-n", "0", "-rA", "tests/data/leaks.py"], cwd=REPO,
                          env=clean_env(LEAK_TOKEN=token), capture_output=True, text=True, timeout=170)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "4 passed, 1 error" in out, out
    assert "ERROR tests/data/leaks.py::test_leaves_a_process_a_descriptor_and_a_thread" in out, out
    assert re.search(rf"process \d+: \S*python3 -c import time; time.sleep\(300\) {token}", out), out
    assert re.search(r"descriptor \d+ → /dev/null", out), out
    assert "thread 'left-waiting'" in out, out
    assert processes_with(token) == []

"""The owner of serve's calls (calls/caller.py) in this process, with real
programs through a pass-through sandbox: a request run to an outcome, and
what its closing releases."""

from __future__ import annotations

import os
import shutil
import threading

import pytest
from conftest import PASS_THROUGH, SYSTEM_PATH, pid_alive, wait_for

from linkrun import config
from linkrun.calls.caller import Caller
from linkrun.calls.setup import CallSetup
from linkrun.errors import Refused
from linkrun.processes.runner import LEFTOVER_GRACE, Cancel, Later, Request

SH = shutil.which("sh", path=SYSTEM_PATH)


def sh(script: str, folder: str = "") -> Request:
    return Request(SH, ("-c", script), None, folder, 10.0)


@pytest.fixture
def caller(tmp_path):
    (tmp_path / "work").mkdir()
    settings = config.parse_serve(["--files", str(tmp_path), "--programs-path", SYSTEM_PATH, "--timeout", "1m",
                                   "--output", "16K", "--program", "sh", "--", *PASS_THROUGH])
    owner = Caller(settings, CallSetup(settings))
    yield owner
    owner.close()
    os.close(owner.files_descriptor())  # serve leaves it to its exit (Caller.close says why)


def test_a_request_runs_in_its_folder_to_an_outcome(caller):
    outcome = caller.run(sh("pwd; echo oops >&2; exit 3", "work"), Cancel())
    assert (outcome.exit, outcome.signal, outcome.timed_out) == (3, None, False)
    assert bytes(outcome.output.head).decode().endswith("/work\n") and bytes(outcome.errors.head) == b"oops\n"
    assert outcome.git_notes == [] and outcome.no_internet is None and outcome.refused is None


def test_starts_trial_refuses_a_folder_through_a_link_and_runs_nothing(caller, tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "work")
    with pytest.raises(Refused, match="link"):
        caller.check(sh("touch ran", "link"))
    assert not (tmp_path / "work" / "ran").exists()


def test_closing_kills_a_leftover_at_once_not_a_second_later(caller):
    outcome = caller.run(sh("sleep 100 >/dev/null 2>&1 & echo $!"), Cancel())
    leftover = int(bytes(outcome.output.head))
    assert pid_alive(leftover)  # killed a second after its program, or at serve's end
    caller.close()
    wait_for(lambda: not pid_alive(leftover), timeout=LEFTOVER_GRACE / 2, what="the leftover killed by the close")


def test_the_leftovers_of_calls_are_killed_each_at_its_time_by_one_thread_that_then_ends(caller):
    leftovers = []
    for _ in range(3):
        outcome = caller.run(sh("sleep 100 >/dev/null 2>&1 & echo $!"), Cancel())
        leftovers.append(int(bytes(outcome.output.head)))
    assert all(pid_alive(pid) for pid in leftovers)
    assert [thread.name for thread in threading.enumerate()].count("leftovers") == 1
    wait_for(lambda: not any(pid_alive(pid) for pid in leftovers), timeout=LEFTOVER_GRACE * 5,
             what="each leftover killed a second after its program")
    wait_for(lambda: "leftovers" not in [thread.name for thread in threading.enumerate()], timeout=5,
             what="the thread to end with none left")


def test_what_a_call_leaves_for_after_its_answer_runs_once_in_order_and_past_a_job_that_fails(capfd):
    ran: list[str] = []
    later = Later()
    later.add(lambda: ran.append("first"))
    later.add(lambda: 1 / 0)
    later.add(lambda: ran.append("last"))
    later.run()
    later.run()  # nothing is left: each job ran once
    assert ran == ["first", "last"]
    assert "ZeroDivisionError" in capfd.readouterr().err  # said, not raised: the answer is out by then

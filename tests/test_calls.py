"""The threads that run a session's calls (linkrun/front/calls.py): a call
starts on a thread kept from an earlier one when one is idle, calls at once
each get their own, and an idle thread ends after its wait."""

from __future__ import annotations

import threading
import time

from conftest import wait_for

from linkrun.front.calls import Workers


def workers_alive() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "call"]


def test_a_call_runs_on_the_thread_an_earlier_one_left_idle() -> None:
    workers = Workers(idle=5.0)
    ran: list[int] = []
    for _ in range(3):
        workers.run(lambda: ran.append(threading.get_ident()))
        workers.wait(time.monotonic() + 10)
    assert len(ran) == 3 and len(set(ran)) == 1, ran
    workers.idle_for = 0.0  # let the idle one end now, for the leak check
    workers.run(lambda: None)
    wait_for(lambda: not workers_alive(), timeout=10, what="the idle worker to end")


def test_calls_at_once_each_get_a_thread_and_idle_ones_end() -> None:
    workers = Workers(idle=0.2)
    release = threading.Event()
    started = threading.Semaphore(0)
    ran: set[int] = set()

    def call() -> None:
        ran.add(threading.get_ident())
        started.release()
        release.wait(10)

    for _ in range(4):
        workers.run(call)
    for _ in range(4):
        assert started.acquire(timeout=10), "a call never started: no thread was free for it"
    assert len(ran) == 4
    release.set()
    workers.wait(time.monotonic() + 10)
    wait_for(lambda: not workers_alive(), timeout=10, what="the idle workers to end")


def test_a_failing_call_leaves_its_worker_serving() -> None:
    workers = Workers(idle=0.2)

    def fail() -> None:
        raise RuntimeError("a bug")

    workers.run(fail)
    done = threading.Event()
    workers.run(done.set)
    assert done.wait(10)
    workers.wait(time.monotonic() + 10)
    wait_for(lambda: not workers_alive(), timeout=10, what="the idle workers to end")

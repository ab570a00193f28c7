"""A call's path through serve: the threads that run a session's calls
(linkrun/front/calls.py), where a call starts on a thread kept from an
earlier one when one is idle, calls at once each get their own, and an idle
thread ends after its wait; and a sandboxed call's end, where nothing of it
is left for later once it is answered."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from conftest import SERVER, require_sandbox, wait_for
from sandbox_helpers import Agent

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


def test_calls_at_once_each_get_a_thread_and_a_few_wait_for_more() -> None:
    workers = Workers(idle=5.0, kept=2)
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
    wait_for(lambda: len(workers_alive()) == 2, timeout=10, what="all but the two kept to end")
    workers.idle_for = 0.0  # let the kept ones end now, for the leak check
    workers.run(lambda: None)
    workers.run(lambda: None)
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


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            pass  # the thread ended meanwhile
    return found


def zombies_below(pid: int) -> list[str]:
    """The processes below `pid` that ended and wait to be reaped, by name."""
    found, todo = [], children(pid)
    while todo:
        child = todo.pop()
        try:
            comm, _, rest = Path(f"/proc/{child}/stat").read_text().rpartition(")")
        except OSError:
            continue  # reaped meanwhile
        if rest.split()[0] == "Z":
            found.append(comm.partition("(")[2])
        todo += children(child)
    return found


def test_a_sandboxed_call_is_reaped_before_its_answer(tmp_path, servers) -> None:
    # The sandbox's init dies with bwrap's outer process, and all the sandbox
    # with it: nothing is left to wait a grace for, so the call is reaped at once.
    require_sandbox()
    box = Agent(tmp_path)
    server = servers(SERVER + ["up", "--agent", str(box.root)], env=box.env)
    server.initialize()
    for _ in range(3):
        result = server.call("command", {"program": "sh", "args": ["-c", "echo hi; sleep 30 &"]})
        assert result["structuredContent"]["output"] == "hi", result
        assert zombies_below(server.process.pid) == []
    assert server.close() == 0

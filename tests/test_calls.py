"""A call's path through serve: the threads that run a session's calls
(linkrun/front/calls.py), where a call starts on a thread kept from an
earlier one when one is idle, calls at once each get their own, and an idle
thread ends after its wait; and a sandboxed call's end, where nothing of it
is left for later once it is answered."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from conftest import SERVER, require_sandbox, wait_for
from sandbox_helpers import Agent

from linkrun.front.calls import Workers
from linkrun.front.protocol import Channel
from linkrun.processes.runner import LEFTOVER_GRACE


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


def test_a_call_runs_on_the_thread_that_read_it_while_another_thread_reads_on() -> None:
    # What `handle` leaves for the reading thread runs there, once the reading
    # went to a worker: the call's request and its program meet no thread's
    # wake between them, and the next line (a cancel, say) is still read while it runs.
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    channel = Channel(stdin_r, stdout_w)
    workers = Workers(idle=5.0)
    threads: dict[str, int] = {}
    next_handled, call_done = threading.Event(), threading.Event()

    def handle(line: bytes | None) -> None:
        if line == b"call":
            read_by = threading.get_ident()

            def call() -> None:
                threads["read"], threads["ran"] = read_by, threading.get_ident()
                next_handled.wait(10)  # the next line is handled while this call runs
                call_done.set()

            assert channel.leave_for_reader(call)
        else:
            threads["next"] = threading.get_ident()
            next_handled.set()

    assert not channel.leave_for_reader(lambda: None)  # this thread reads no line
    serving = threading.Thread(target=channel.serve_lines, args=(handle, workers.start))
    serving.start()
    try:
        os.write(stdin_w, b"call\nnext\n")
        assert call_done.wait(10), "the call never ran, or the next line was not read while it ran"
        assert threads["ran"] == threads["read"] != threads["next"], threads
    finally:
        os.close(stdin_w)
        serving.join(10)
        channel.close()
        for fd in (stdin_r, stdout_r, stdout_w, channel._out):  # its own copy of stdout: serve's lives as long as it
            os.close(fd)
    workers.idle_for = 0.0  # let the idle ones end now, for the leak check
    for _ in range(2):
        workers.run(lambda: None)
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


def test_a_sandboxed_call_is_reaped_as_its_answer_goes_out(tmp_path, servers) -> None:
    # The sandbox's init dies with bwrap's outer process, and all the sandbox
    # with it: nothing is left to wait a grace for, so the call is reaped at
    # once, by the thread that sent its answer (runner.Later), well before
    # the grace a leftover gets (LEFTOVER_GRACE, counted from the program's
    # end, which comes before the answer). Timed from the answer: a fresh
    # serve's first call took 1.9 s on a loaded machine, its reap no longer.
    require_sandbox()
    box = Agent(tmp_path)
    server = servers(SERVER + ["up", "--agent", str(box.root)], env=box.env)
    server.initialize()
    for _ in range(3):
        result = server.call("command", {"program": "sh", "args": ["-c", "echo hi; sleep 30 &"]})
        assert result["structuredContent"]["output"] == "hi", result
        wait_for(lambda: zombies_below(server.process.pid) == [], timeout=LEFTOVER_GRACE / 2,
                 what="the call's processes reaped within half a leftover's grace of its answer")
    assert server.close() == 0

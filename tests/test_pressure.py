"""The server under pressure: a client that does not read, waits that must cost
nothing, batches, and what must still hold then (timeouts, the end of serve,
every answer). Real servers through a pass-through sandbox; a "held" server is
one whose stdout the test leaves unread until it says so."""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import termios
import threading
import time
from pathlib import Path

import orjson
import pytest
from background_helpers import META, background_argv, start, wait_running
from conftest import parent_of, RawServer, pid_alive, serve_argv, text_of, wait_for


TICKS = os.sysconf("SC_CLK_TCK")
# A 2025-11-25 answer of a command printing 20,000 bytes carries 16K of them twice (text and
# structured): eight fill a 64 KB pipe several times over.
FILLER = {"program": "sh", "args": ["-c", "head -c 20000 /dev/zero | tr '\\0' a"]}


class HeldServer(RawServer):
    """A server whose stdout the test reads only while `reading` is set."""

    def __init__(self, argv: list[str]) -> None:
        self.reading = threading.Event()
        self.reading.set()
        super().__init__(argv)

    def _read(self) -> None:
        for line in self.process.stdout:
            self.reading.wait()
            self.raw.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def hold(self) -> None:
        self.reading.clear()

    def release(self) -> None:
        self.reading.set()


@pytest.fixture
def held(files):
    started: list[HeldServer] = []

    def begin(argv: list[str] | None = None) -> HeldServer:
        server = HeldServer(argv or serve_argv(files, timeout="30s"))
        started.append(server)
        server.initialize()
        return server

    yield begin
    for server in started:
        server.release()
        server.kill()


def call_message(request_id, arguments: dict, meta: dict | None = None, name: str = "command") -> dict:
    params: dict = {"name": name, "arguments": arguments}
    if meta:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def fill_stdout(server: HeldServer, count: int = 8) -> list[int]:
    """Leave `count` big answers unread: serve's stdout pipe is full."""
    server.hold()
    ids = list(range(9000, 9000 + count))
    for request_id in ids:
        server.send(call_message(request_id, FILLER))
    fd = server.process.stdout.fileno()
    wait_for(lambda: unread(fd) >= 60_000, timeout=15, what="serve's stdout pipe to be full")
    return ids


def unread(fd: int) -> int:
    """The bytes waiting in a pipe."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]


def wait_pid_file(path: Path) -> int:
    return int(wait_for(lambda: path.exists() and path.read_text().strip(), what=f"{path.name}"))


def cpu_seconds(pid: int) -> float:
    """The process's user and system time so far, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def progress_of(server: RawServer, token) -> list[dict]:
    return [m["params"] for m in map(orjson.loads, list(server.raw))
            if isinstance(m, dict) and m.get("method") == "notifications/progress"
            and m["params"]["progressToken"] == token and type(m["params"]["progressToken"]) is type(token)]


# -- a timeout is a timeout, whatever the client does ------------------------------


def test_a_call_times_out_while_the_client_reads_nothing(held, files):
    server = held()
    fillers = fill_stdout(server)
    ticking = "echo $$ > work/tick.pid; while :; do echo tick; sleep 0.3; done"
    server.send(call_message(1, {"program": "sh", "args": ["-c", ticking], "timeout": 2},
                             {"progressToken": "tok"}))
    pid = wait_pid_file(files / "work" / "tick.pid")
    wait_for(lambda: not pid_alive(pid), timeout=15, what="the call to be killed at its 2 s timeout")
    server.release()
    answer = server.wait_response(1, timeout=15)["result"]
    assert answer["structuredContent"]["timed_out"] is True, text_of(answer)
    for request_id in fillers:
        assert "aaaa" in text_of(server.wait_response(request_id, timeout=15)["result"])
    # Its progress waited behind the unread answers as one notification, the latest, not a backlog.
    notes = progress_of(server, "tok")
    # Its progress is the call's seconds so far (they rise while the output may not).
    assert len(notes) == 1 and 0 < notes[0]["progress"] <= answer["structuredContent"]["seconds"], notes


# -- serve ends, whatever the client does ----------------------------------------------


@pytest.mark.parametrize("how", ["stdin closed", "SIGTERM"])
def test_serve_ends_and_kills_its_calls_while_its_stdout_is_full(held, files, how):
    server = held()
    fill_stdout(server)
    server.send(call_message(1, {"program": "sh", "args": ["-c", "echo $$ > work/long.pid; exec sleep 60"]}))
    pid = wait_pid_file(files / "work" / "long.pid")
    if how == "SIGTERM":
        server.process.send_signal(signal.SIGTERM)
    else:
        server.process.stdin.close()
    wait_for(lambda: server.process.poll() is not None, timeout=15, what="serve to exit")
    assert server.process.returncode == 0
    wait_for(lambda: not pid_alive(pid), what="the call's program to be killed")


# -- an answer that waits for the client is a queued write, not a parked thread -------


def test_answers_the_client_has_not_read_hold_no_thread_and_none_is_lost(held, files):
    server = held()
    server.hold()
    count = 1000
    for request_id in range(count):
        server.send(call_message(request_id, {"program": "nonesuch"}))
    # The last call runs a program: once it has, serve has read and dispatched every call before it.
    server.send(call_message("last", {"program": "sh", "args": ["-c", "echo $$ > work/last.pid"]}))
    wait_pid_file(files / "work" / "last.pid")
    pid = server.process.pid
    wait_for(lambda: threads_of(pid) < 20, timeout=30,
             what=f"serve's threads to go back under 20 with {count} answers unread (now {threads_of(pid)})")
    server.release()
    for request_id in range(count):
        assert "nonesuch" in text_of(server.wait_response(request_id, timeout=30)["result"])
    assert "exit 0" in text_of(server.wait_response("last", timeout=30)["result"])


# -- a batch is as concurrent as single calls ----------------------------------------------


def test_a_batch_runs_its_calls_at_once(held):
    server = held()
    server.initialize("2025-03-26")
    started = time.monotonic()
    server.send([call_message(request_id, {"program": "sleep", "args": ["1"]}) for request_id in range(5)])
    answer = server.next_message(timeout=30)
    elapsed = time.monotonic() - started
    assert sorted(item["id"] for item in answer) == list(range(5))
    assert all(text_of(item["result"]).startswith("exit 0") for item in answer), answer
    assert elapsed < 3.5, f"five sleep 1 in a batch took {elapsed:.2f} s"


# -- a fractional progress token is a token ------------------------------------------------


def test_a_fractional_progress_token_gets_progress(held):
    server = held()
    ticking = {"program": "sh", "args": ["-c", "for i in 1 2 3 4; do echo tick $i; sleep 0.3; done"]}
    server.send(call_message(1, ticking, {"progressToken": 1.5}))
    server.wait_response(1, timeout=15)
    notes = progress_of(server, 1.5)
    assert len(notes) >= 2, notes


# -- waiting costs nothing ------------------------------------------------------------------


def test_a_waiting_read_costs_no_cpu_and_its_progress_rises_a_few_times_a_second(servers, files, state):
    server = servers(background_argv(files, state))
    server.initialize()
    command_id = start(server, program="sleep", args=["30"])
    wait_running(state, command_id)
    server.call("read", {"id": command_id, "offset": 0, "wait": 0.2}, meta=META)  # loads the watch once
    before = cpu_seconds(server.process.pid)
    began = time.monotonic()
    result = server.call("read", {"id": command_id, "offset": 0, "wait": 5}, meta={**META, "progressToken": "r"})
    waited = time.monotonic() - began
    spent = cpu_seconds(server.process.pid) - before
    assert result["structuredContent"]["next"] == 0 and waited >= 4.9
    print(f"CPU of serve over a {waited:.2f} s read wait: {spent:.3f} s")
    assert spent < 0.15, f"serve used {spent:.2f} s of CPU while a read waited {waited:.1f} s"
    values = [note["progress"] for note in progress_of(server, "r")]
    assert 1 <= len(values) <= 4 * waited + 2, values
    assert values == sorted(set(values)), values


def test_a_waiting_stop_costs_no_cpu(servers, files, state):
    server = servers(background_argv(files, state))
    server.initialize()
    command_id = start(server, program="sleep", args=["30"])
    gate = wait_running(state, command_id)["leader_pid"]
    supervisor = parent_of(gate)
    server.call("read", {"id": command_id, "offset": 0, "wait": 0.2}, meta=META)  # loads the watch once
    os.kill(supervisor, signal.SIGSTOP)  # it cannot answer the stop: serve waits it out
    try:
        before = cpu_seconds(server.process.pid)
        began = time.monotonic()
        result = server.call("stop", {"id": command_id}, meta=META)
        waited = time.monotonic() - began
        spent = cpu_seconds(server.process.pid) - before
    finally:
        os.kill(supervisor, signal.SIGCONT)
    assert result["structuredContent"]["state"] == "running" and waited >= 4.9
    print(f"CPU of serve over a {waited:.2f} s stop wait: {spent:.3f} s")
    assert spent < 0.15, f"serve used {spent:.2f} s of CPU while a stop waited {waited:.1f} s"


def test_a_supervisors_watch_wakes_on_a_change_never_on_a_read(tmp_path):
    """Every read of any record opens a file of the state folder: a running
    supervisor's watch of its stop file must not wake for it."""
    from linkrun.detached.watch import watch_paths

    stop = tmp_path / "c1.stop"
    record = tmp_path / "c1.json"
    record.write_bytes(b"{}")
    wakes = threading.Semaphore(0)
    observer = watch_paths(str(tmp_path), (str(stop), str(record)), wakes.release)
    try:
        for _ in range(200):
            record.read_bytes()
        stop.write_bytes(b"stopped")  # a change, after the reads: the first wake must be its own
        assert wakes.acquire(timeout=10), "the stop file's creation woke nothing"
        while wakes.acquire(timeout=0.2):  # the creation's own events (create, modify, close)
            pass
        for _ in range(200):
            record.read_bytes()
        assert not wakes.acquire(timeout=0.5), "a read of a record woke the supervisor"
    finally:
        observer.stop()
        observer.join()

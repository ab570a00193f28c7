"""`read` with `wait` and `pattern` waits on a line: it returns as soon as a
line matching it is printed after the offset, or the command ends, or the
wait does, and says which. Real servers, real supervisors, real programs
(a pass-through sandbox) that print on a cue the test gives by a file."""

from __future__ import annotations

import os
import time

import pytest
from background_helpers import META, background_argv, start, wait_ended, wait_running
from conftest import text_of, wait_for

# Prints its first argument, then waits for the file `go` and prints its second (printf: no newline added).
CUED = ("import os, sys, time\n"
        "sys.stdout.write(sys.argv[1]); sys.stdout.flush()\n"
        "while not os.path.exists('go'): time.sleep(0.005)\n"
        "sys.stdout.write(sys.argv[2]); sys.stdout.flush()\n"
        "while not os.path.exists('end'): time.sleep(0.005)\n")


@pytest.fixture
def server(servers, files, state):
    server = servers(background_argv(files, state, output="16K"))
    server.initialize()
    return server


def cued(server, first: str, second: str) -> str:
    return start(server, program="python3", args=["-c", CUED, first, second], folder="work")


def output_size(files, command_id: str) -> int:
    try:
        return os.path.getsize(files / "background" / f"{command_id}.out")
    except FileNotFoundError:
        return 0


def send_read(server, request_id: int, **arguments: object) -> None:
    server.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                 "params": {"name": "read", "arguments": arguments, "_meta": META}})


def answer_of(server, request_id: int) -> tuple[dict, str]:
    result = server.wait_response(request_id, timeout=30)["result"]
    assert "isError" not in result, text_of(result)
    return result["structuredContent"], text_of(result)


def test_a_wait_on_a_line_returns_when_it_is_printed(server, files, state):
    command_id = cued(server, "starting\n", "listening on :8000\nready\n")
    wait_for(lambda: output_size(files, command_id) == 9, what="the first line")
    send_read(server, 100, id=command_id, pattern="listening on", wait=25)
    (files / "work" / "go").touch()
    value, text = answer_of(server, 100)
    assert value["until"] == "match" and value["state"] == "running"
    assert [(line["line"], line["offset"], line["text"]) for line in value["lines"]] == [(2, 9, "listening on :8000")]
    assert value["next"] == 28  # after the line: the next wait goes on from there
    assert "a line matched after" in text.splitlines()[0] and text.splitlines()[1] == "2 @9: listening on :8000"
    assert value["waited"] < 20
    (files / "work" / "end").touch()
    wait_ended(state, command_id)


def test_a_match_split_across_two_writes_is_found_whole(server, files, state):
    command_id = cued(server, "booting\nlisten", "ing on :8000\n")
    wait_for(lambda: output_size(files, command_id) == 14, what="the first write")
    # The first piece alone is a line not ended: not matched, and the next wait starts at it.
    value, text = server_read(server, id=command_id, pattern="listening on", wait=0.3)
    assert value["until"] == "time" and value["lines"] == [] and value["next"] == 8
    assert "no line matched" in text.splitlines()[0]
    send_read(server, 101, id=command_id, pattern="listening on", wait=25, offset=value["next"])
    (files / "work" / "go").touch()
    value, _ = answer_of(server, 101)
    assert value["until"] == "match"
    assert [(line["offset"], line["text"]) for line in value["lines"]] == [(8, "listening on :8000")]
    (files / "work" / "end").touch()
    wait_ended(state, command_id)


def server_read(server, **arguments: object) -> tuple[dict, str]:
    result = server.call("read", arguments, meta=META)
    assert "isError" not in result, text_of(result)
    return result["structuredContent"], text_of(result)


def test_a_wait_on_a_line_returns_at_the_end_saying_so(server, state):
    command_id = start(server, program="python3", args=["-c", "import time; print('a'); time.sleep(0.5); print('b')"])
    value, text = server_read(server, id=command_id, pattern="listening", wait=25)
    assert value["until"] == "end" and value["lines"] == [] and value["state"] == "exited"
    assert value["waited"] < 20 and "no line after the offset matched" in text.splitlines()[0]
    wait_ended(state, command_id)


def test_a_last_line_without_a_newline_matches_at_the_end(server, files, state):
    command_id = cued(server, "a\n", "listening on :1")
    wait_for(lambda: output_size(files, command_id) == 2, what="the first line")
    (files / "work" / "go").touch()
    wait_for(lambda: output_size(files, command_id) == 17, what="the last line")
    value, _ = server_read(server, id=command_id, pattern="listening on", wait=0.2)
    assert value["until"] == "time" and value["lines"] == []  # not ended: the line may go on
    (files / "work" / "end").touch()
    value, _ = server_read(server, id=command_id, pattern="listening on", wait=25, offset=value["next"])
    assert value["until"] == "match" and [line["text"] for line in value["lines"]] == ["listening on :1"]
    assert value["state"] == "exited" and value["next"] == 17
    wait_ended(state, command_id)


def test_a_wait_on_a_line_ends_with_its_time(server, files, state):
    command_id = cued(server, "a\n", "b\n")
    wait_running(state, command_id)
    started = time.monotonic()
    value, text = server_read(server, id=command_id, pattern="never", wait=0.5)
    assert 0.45 <= time.monotonic() - started < 5
    assert value["until"] == "time" and value["state"] == "running"
    assert "wait again with offset=" in text.splitlines()[0]
    (files / "work" / "go").touch()
    (files / "work" / "end").touch()
    wait_ended(state, command_id)


def test_a_wait_on_a_line_follows_the_output_across_rotations(server, files, state):
    # 16K kept: 200000 numbered lines rotate the file many times before the line comes.
    script = ("import os, time\n"
              "while not os.path.exists('go'): time.sleep(0.005)\n"
              "print(''.join(f'{i:06d}\\n' for i in range(200000)) + 'listening on :9', flush=True)\n"
              "while not os.path.exists('end'): time.sleep(0.005)\n")
    command_id = start(server, program="python3", args=["-c", script], folder="work")
    wait_running(state, command_id)
    send_read(server, 102, id=command_id, pattern="^listening", wait=25)
    (files / "work" / "go").touch()
    value, _ = answer_of(server, 102)
    assert value["until"] == "match"
    assert [(line["offset"], line["text"]) for line in value["lines"]] == [(200000 * 7, "listening on :9")]
    assert value["kept_from"] > 0
    (files / "work" / "end").touch()
    wait_ended(state, command_id)


def test_wait_with_lines_is_refused_and_a_kept_output_answers_at_once(servers, files, state):
    server = servers(background_argv(files, state, extra=("--keep-output", "16M", "--keep-for", "1d",
                                                          "--keep-total", "256M")))
    server.initialize()
    script = "print('x' * 20000); print('listening on :1')"
    kept_id = server.call("command", {"program": "python3", "args": ["-c", script]},
                          meta=META)["structuredContent"]["output_id"]
    value, _ = server_read(server, id=kept_id, pattern="listening", wait=25)
    assert value["until"] == "end" and [line["text"] for line in value["lines"]] == ["listening on :1"]
    answer = server.call("read", {"id": kept_id, "lines": "1-2", "wait": 5}, meta=META)
    assert answer.get("isError") is True and "wait is taken with pattern alone" in text_of(answer)


def cpu_seconds_of(pid: int) -> float:
    """The CPU time a process (all its threads) used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_wait_on_a_line_uses_no_cpu_while_nothing_is_printed(server, files, state):
    command_id = cued(server, "a\n", "b\n")
    server_read(server, id=command_id, pattern="never", wait=0.1)  # the watch's first imports, out of the count
    before = cpu_seconds_of(server.process.pid)
    value, _ = server_read(server, id=command_id, pattern="never", wait=2)
    assert value["until"] == "time"
    assert cpu_seconds_of(server.process.pid) - before < 0.05  # polling each millisecond took 0.11 s here
    (files / "work" / "go").touch()
    (files / "work" / "end").touch()
    wait_ended(state, command_id)


def test_a_prompt_not_ended_by_a_newline_matches_once_the_command_waits_for_input(server, state):
    # A new user's trial: a wait on ">>> " waited its whole time while the prompt waited for a write.
    command_id = start(server, program="sh", args=["-c", "echo hello; printf 'name? '; read x; echo \"hi $x\""])
    began = time.monotonic()
    send_read(server, 100, id=command_id, pattern=r"^name\? ", wait=25)
    value, text = answer_of(server, 100)
    assert value["until"] == "match" and time.monotonic() - began < 20, text
    assert [(line["line"], line["offset"], line["text"]) for line in value["lines"]] == [(2, 6, "name? ")]
    assert "waits for input" in text
    # A last line that does not match, while it waits, is not a match: the wait goes on to its time.
    send_read(server, 101, id=command_id, pattern="^nothing", wait=1)
    value, _ = answer_of(server, 101)
    assert value["until"] == "time"
    server.call("write", {"id": command_id, "text": "you\n"}, meta=META)
    assert wait_ended(state, command_id)["exit"] == 0

"""Background commands: start, list, read, stop, with real detached
supervisors, real gates and real signals (through a pass-through sandbox)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import orjson
import pytest
from background_helpers import META, OTHER, background_argv, payload, read, record, start, wait_ended, wait_running
from conftest import SERVER, child_running, parent_of, pid_alive, serve_argv, text_of, wait_for

from linkrun.state import layout, records

def test_start_answers_at_once_and_the_command_runs_to_its_end(bg, state, files):
    started = time.monotonic()
    command_id = start(bg, program="sh", args=["-c", "echo hello; echo oops >&2; exit 3"])
    assert time.monotonic() - started < 1
    assert records.ID.match(command_id)
    ended = wait_ended(state, command_id)
    assert (ended["state"], ended["exit"], ended["signal"], ended["bytes"]) == ("exited", 3, None, 11)
    assert ended["told"] == "no way in"
    assert (files / "background" / f"{command_id}.out").read_bytes() == b"hello\noops\n"
    wait_for(lambda: not records.is_held(str(state), command_id), what="the supervisor to exit")


def test_the_command_outlives_the_call_and_a_killed_server(servers, files, state):
    server = servers(background_argv(files, state))
    server.initialize()
    command_id = start(server, program="sh", args=["-c", "read line; echo got $line"], input="it\n")
    server.process.kill()
    server.process.wait()
    ended = wait_ended(state, command_id)
    assert ended["state"] == "exited" and ended["exit"] == 0
    assert (files / "background" / f"{command_id}.out").read_bytes() == b"got it\n"


def test_the_supervisor_is_not_the_servers_child_and_reaps_nothing_left(bg, state):
    command_id = start(bg, program="sleep", args=["100"])
    running = wait_running(state, command_id)
    gate = running["leader_pid"]
    supervisor = parent_of(gate)
    assert supervisor != bg.process.pid
    parent = parent_of(supervisor)
    assert parent != bg.process.pid
    # No zombie intermediate left under serve.
    children = Path(f"/proc/{bg.process.pid}/task/{bg.process.pid}/children").read_text().split()
    assert not children


def test_stop_leaves_nothing_running_grandchildren_included(bg, state, files):
    command_id = start(bg, program="sh", args=["-c", "sleep 100 & echo $! > work/pid; wait"])
    wait_running(state, command_id)
    pid_file = files / "work" / "pid"
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the grandchild")
    grandchild = int(pid_file.read_text())
    started = time.monotonic()
    result = bg.call("stop", {"id": command_id}, meta=META)
    assert time.monotonic() - started < 3
    assert result["structuredContent"]["state"] == "stopped"
    assert not pid_alive(grandchild)


def test_a_program_that_ignores_term_is_killed_two_seconds_after(bg, state):
    command_id = start(bg, program="sh", args=["-c", "trap '' TERM; echo ready; while :; do sleep 0.1; done"])
    wait_for(lambda: b"ready" in read_all(bg, command_id), what="the program to be ready")
    started = time.monotonic()
    result = bg.call("stop", {"id": command_id}, meta=META)
    assert 1.5 < time.monotonic() - started < 8  # TERM, 2 s of grace, KILL; slack for a loaded machine
    assert result["structuredContent"]["state"] == "stopped"
    assert result["structuredContent"]["signal"] == "SIGKILL"


def test_a_record_removed_while_stop_waits_is_answered_as_unknown(bg, state):
    command_id = start(bg, program="sh", args=["-c", "trap '' TERM; echo ready; while :; do sleep 0.1; done"])
    wait_for(lambda: b"ready" in read_all(bg, command_id), what="the program to be ready")
    answer: list[dict] = []
    stopping = threading.Thread(target=lambda: answer.append(bg.call("stop", {"id": command_id}, meta=META)))
    stopping.start()
    # The program ignores the TERM: stop waits its two seconds of grace, and the record goes meanwhile.
    wait_for(lambda: os.path.exists(layout.path(state, command_id, layout.STOP)), what="the stop file")
    os.unlink(layout.path(state, command_id, layout.RECORD))
    stopping.join()
    assert answer[0].get("isError") is True
    assert text_of(answer[0]).startswith(f"Refused: no command of this conversation's has id '{command_id}'")


def test_a_stop_sent_right_after_start_is_not_lost(bg, state):
    command_id = start(bg, program="sleep", args=["100"])
    result = bg.call("stop", {"id": command_id}, meta=META)
    assert result["structuredContent"]["state"] == "stopped"


def test_a_killed_supervisor_takes_the_command_with_it(bg, state):
    command_id = start(bg, program="sleep", args=["100"])
    gate = wait_running(state, command_id)["leader_pid"]
    supervisor = parent_of(gate)
    os.kill(supervisor, signal.SIGKILL)
    wait_for(lambda: not pid_alive(gate), what="the command to die with its supervisor")
    # A sweep's to mend: "running" until serve's first sweep (which may come meanwhile) finds it lost.
    assert record(state, command_id)["state"] in ("running", "lost")
    wait_for(lambda: not records.is_held(str(state), command_id), what="the lock to be free")


def test_list_shows_a_command_whose_supervisor_died_as_lost_at_once(bg, state):
    command_id = start(bg, program="sleep", args=["100"])
    gate = wait_running(state, command_id)["leader_pid"]
    os.kill(parent_of(gate), signal.SIGKILL)
    wait_for(lambda: not records.is_held(str(state), command_id), what="the lock to be free")
    entry = bg.call("list", {}, meta=META)["structuredContent"]["commands"][0]
    assert (entry["id"], entry["state"]) == (command_id, "lost")


def test_list_waits_for_the_end_a_sweep_is_writing_of_a_command_whose_supervisor_died(servers, files, state):
    # A sweep (serve's own, another serve's, the bridge's) holds the lock
    # while it writes the end: list, then, must not say the command runs.
    # The state folder is there before serve, as after an agent's first day:
    # serve's first sweep runs, and it ends before this test plays a sweep
    # (else it may be the one that takes the dead supervisor's lock).
    state.mkdir()
    bg = servers(background_argv(files, state))
    bg.initialize()
    wait_for(lambda: (state / layout.SWEEP_LOCK).exists() and child_running(bg.process.pid, b"sweep") is None,
             what="serve's first sweep to end")
    command_id = start(bg, program="sleep", args=["100"])
    gate = wait_running(state, command_id)["leader_pid"]
    os.kill(parent_of(gate), signal.SIGKILL)
    # The lock, once the killed supervisor's last thread let it go (wait_for gives the fd back).
    sweeping = wait_for(lambda: [fd for fd in [records.try_lock(str(state), command_id)] if fd is not None],
                        what="the lock to be free once the supervisor is dead")[0]
    answers: list[dict] = []
    lister = threading.Thread(target=lambda: answers.append(bg.call("list", {}, meta=META)))
    try:
        lister.start()
        lister.join(0.5)  # while the lock is held, list has no answer to give yet
        assert not answers, "list answered while the end was being written"
    finally:
        os.close(sweeping)  # a sweep that ended without writing: list sweeps it itself
    lister.join(10)
    entry = answers[0]["structuredContent"]["commands"][0]
    assert (entry["id"], entry["state"]) == (command_id, "lost")


def test_a_supervisor_sent_sigterm_ends_the_command_lost_and_untold(servers, files, tmp_path):
    state = tmp_path / "state-told"
    server = servers(serve_argv(files, "--state", str(state), "--way-in", "http://127.0.0.1:9/in", "--as", "agent",
                                "--keyring", str(tmp_path), "--background", "4", "--background-timeout", "1h",
                                "--background-output", "16M", "--background-keep", "1d",
                                "--background-per-day", "100", "--hops", "4"))
    server.initialize()
    command_id = start(server, program="sleep", args=["100"])
    gate = wait_running(state, command_id)["leader_pid"]
    supervisor = parent_of(gate)
    os.kill(supervisor, signal.SIGTERM)
    ended = wait_ended(state, command_id)
    assert (ended["state"], ended["told"]) == ("lost", "untold")
    assert not pid_alive(gate)


def test_a_program_cannot_reach_the_lock(bg, state, files):
    command_id = start(bg, program="sh", args=["-c", "for f in /proc/$$/fd/*; do readlink $f; done; sleep 100"])
    running = wait_running(state, command_id)
    wait_for(lambda: read_all(bg, command_id), what="the descriptors listing")
    listing = read_all(bg, command_id).decode()
    assert ".lock" not in listing and ".json" not in listing
    for fd in os.listdir(f"/proc/{running['leader_pid']}/fd"):
        assert not os.readlink(f"/proc/{running['leader_pid']}/fd/{fd}").endswith(".lock")


def test_ten_megabytes_of_input_reach_a_background_command(bg, state):
    data = "x" * (10 * 1024 * 1024)
    command_id = start(bg, program="sh", args=["-c", "wc -c"], input=data)
    assert wait_ended(state, command_id)["exit"] == 0
    assert read_all(bg, command_id).strip() == str(len(data)).encode()
    assert not os.path.exists(layout.path(str(state), command_id, ".in"))


def test_the_background_timeout_stops_it(servers, files, state):
    server = servers(background_argv(files, state, timeout="1"))
    server.initialize()
    command_id = start(server, program="sleep", args=["100"])
    ended = wait_ended(state, command_id)
    assert ended["state"] == "timed out"


def read_all(server, command_id, meta=META) -> bytes:
    result = server.call("read", {"id": command_id, "offset": 0}, meta=meta)
    assert "isError" not in result, text_of(result)
    return payload(result["structuredContent"], text_of(result))


# -- read --------------------------------------------------------------------------


@pytest.fixture
def ended_with(bg, state):
    def run(script: str):
        command_id = start(bg, program="sh", args=["-c", script])
        wait_ended(state, command_id)
        return command_id
    return run


def test_read_without_offset_gives_the_last_output_bytes(bg, ended_with):
    command_id = ended_with("head -c 40000 /dev/zero | tr '\\0' a; printf END")
    value, text = read(bg, id=command_id)
    assert value["next"] == value["total"] == 40003
    assert value["offset"] == 40003 - 16384
    assert text.endswith("aaaEND")


def test_read_at_or_past_total_gives_nothing_and_says_it_ended(bg, ended_with):
    command_id = ended_with("printf hello")
    value, text = read(bg, id=command_id, offset=5)
    assert (value["offset"], value["next"], value["total"]) == (5, 5, 5)
    assert "ended: no more output" in text.partition("\n")[0]
    value, _ = read(bg, id=command_id, offset=500)
    assert (value["offset"], value["next"]) == (5, 5)


def test_read_below_kept_from_starts_there_and_says_what_was_dropped(servers, files, state):
    server = servers(background_argv(files, state, output="1K"))
    server.initialize()
    command_id = start(server, program="sh", args=["-c", "seq 1 2000"])
    ended = wait_ended(state, command_id)
    assert ended["kept_from"] == ended["bytes"] - 1024
    assert os.path.getsize(files / "background" / f"{command_id}.out") == 1024
    value, text = read(server, id=command_id, offset=0)
    assert value["offset"] == ended["kept_from"]
    assert f"bytes 0–{ended['kept_from']} dropped" in text.partition("\n")[0]


def test_read_never_splits_a_character(servers, files, state):
    server = servers(background_argv(files, state, output="1K"))
    server.initialize()
    # 3000 two-byte characters: a cut at an odd byte must not split one.
    command_id = start(server, program="python3", args=["-c", "print('é' * 3000, end='')"])
    wait_ended(state, command_id)
    for offset in (None, 0, 4999):
        arguments = {"id": command_id} if offset is None else {"id": command_id, "offset": offset}
        value, text = read(server, **arguments)
        assert "\ufffd" not in text
        assert (value["next"] - value["offset"]) % 2 == 0


def test_read_with_wait_returns_when_output_comes(bg, state, files):
    command_id = start(bg, program="sh", args=["-c", "read x; echo late"], input="go\n")
    value, _ = read(bg, id=command_id, offset=0, wait=10)
    assert value["next"] == 5


def test_read_with_wait_returns_at_the_end(bg, state):
    command_id = start(bg, program="sh", args=["-c", "sleep 0.3"])
    started = time.monotonic()
    value, text = read(bg, id=command_id, offset=0, wait=10)
    assert time.monotonic() - started < 5
    wait_ended(state, command_id)


def test_output_read_while_it_rotates_is_never_at_a_stale_offset(servers, files, state):
    server = servers(background_argv(files, state, output="4K"))
    server.initialize()
    # The program goes on past each of its three parts only when a read with
    # data let it (a byte in the gate): at least three reads see it rotate,
    # however fast it writes.
    os.mkfifo(files / "gate")
    gate = os.open(files / "gate", os.O_RDWR | os.O_NONBLOCK)
    # Fixed-width numbered lines: the bytes at any offset are known.
    command_id = start(server, program="python3", args=["-c", (
        "import sys\ngate = open('gate', 'rb')\nfor part in range(3):\n"
        "    for i in range(part * 100000, (part + 1) * 100000): sys.stdout.write('%09d\\n' % i)\n"
        "    sys.stdout.flush()\n    gate.read(1)\n")])
    offset, checked = 0, 0
    while True:
        value, text = read(server, id=command_id, offset=offset, wait=5)
        data = payload(value, text)
        if data:
            start_at = value["offset"]
            expected = b"".join(b"%09d\n" % i for i in range(start_at // 10, (start_at + len(data)) // 10 + 2))
            skip = start_at % 10
            assert data == expected[skip:skip + len(data)], f"stale bytes at {start_at}"
            checked += 1
            if checked <= 3:
                os.write(gate, b".")
        offset = value["next"]
        if value["state"] not in ("starting", "running") and value["next"] == value["total"]:
            break
    os.close(gate)
    assert checked > 2
    assert value["total"] == 3000000


def test_a_link_planted_at_the_output_is_not_followed(bg, ended_with, files):
    command_id = ended_with("echo mine")
    output = files / "background" / f"{command_id}.out"
    output.unlink()
    output.symlink_to("/etc/passwd")
    result = bg.call("read", {"id": command_id}, meta=META)
    assert result.get("isError") is True
    assert "link" in text_of(result)
    assert "root:" not in text_of(result)


def test_a_link_at_one_running_commands_output_leaves_list_whole_and_names_it(bg, state, files):
    other = start(bg, program="sleep", args=["100"])
    linked = start(bg, program="sleep", args=["100"])
    wait_running(state, other)
    wait_running(state, linked)
    output = files / "background" / f"{linked}.out"
    output.unlink()
    output.symlink_to("/etc/passwd")  # planted on the host while the command runs
    result = bg.call("list", {}, meta=META)
    assert result.get("isError") is not True, text_of(result)
    entries = {entry["id"]: entry for entry in result["structuredContent"]["commands"]}
    assert set(entries) == {other, linked}
    assert "unreadable" not in entries[other]
    assert "is a link" in entries[linked]["unreadable"]
    assert f"{linked}" in text_of(result) and "output unreadable" in text_of(result)
    assert "root:" not in text_of(result)


def test_a_link_planted_at_background_refuses_start(servers, files, state, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (files / "background").symlink_to(elsewhere)
    server = servers(background_argv(files, state))
    server.initialize()
    result = server.call("start", {"program": "true"}, meta=META)
    assert result.get("isError") is True
    assert "is a link" in text_of(result)
    assert not list(elsewhere.iterdir())


# -- conversations, hops, caps ---------------------------------------------------------


def test_a_missing_id_is_named_missing_not_shown_as_none(bg):
    for tool in ("read", "stop", "write"):
        for arguments in ({}, {"id": None}):
            answer = bg.call(tool, arguments)
            assert answer["isError"] is True
            assert text_of(answer) == ("Refused: id is missing; give the id that start answered (list shows this "
                                       "conversation's commands)")


def test_another_conversations_command_is_answered_as_unknown(bg, state):
    command_id = start(bg, program="sleep", args=["100"])
    wait_running(state, command_id)
    assert text_of(bg.call("list", {}, meta=OTHER)) == "No background command of this conversation's."
    for tool in ("read", "stop"):
        theirs = bg.call(tool, {"id": command_id}, meta=OTHER)
        unknown = bg.call(tool, {"id": "a" * 16}, meta=OTHER)
        malformed = bg.call(tool, {"id": "../../etc/passwd"}, meta=OTHER)
        assert theirs["isError"] and unknown["isError"] and malformed["isError"]
        assert text_of(theirs) == text_of(unknown).replace("a" * 16, command_id)
        assert "no command of this conversation's" in text_of(malformed)
    assert record(state, command_id)["state"] == "running"


# No thread at all is the default conversation under --no-way-in, and refused with a
# way in: tests/test_plain_clients.py.
@pytest.mark.parametrize("meta, words", [
    ({"link.local/thread": ""}, "need the conversation"),
    ({"link.local/thread": "t", "link.local/hops": "1"}, "whole number"),
    ({"link.local/thread": "t", "link.local/hops": 1.5}, "whole number"),
    ({"link.local/thread": "t", "link.local/hops": 4}, "hops"),
])
def test_start_needs_a_conversation_below_the_hops(bg, meta, words):
    result = bg.call("start", {"program": "true"}, meta=meta)
    assert result.get("isError") is True
    assert words in text_of(result)


def test_hops_do_not_limit_command(bg):
    result = bg.call("command", {"program": "true"}, meta={"link.local/thread": "t", "link.local/hops": 99})
    assert "isError" not in result


def test_the_running_cap_holds_under_concurrent_starts_from_several_servers(servers, files, state):
    fleet = [servers(background_argv(files, state, running="2")) for _ in range(6)]
    for server in fleet:
        server.initialize()
    answers = [None] * len(fleet)

    def go(index):
        answers[index] = fleet[index].call("start", {"program": "sleep", "args": ["100"]}, meta=META)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(fleet))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    accepted = [a for a in answers if "isError" not in a]
    refused = [a for a in answers if a.get("isError")]
    assert len(accepted) == 2
    assert all("of this agent run already, its conversations' together, the most at once" in text_of(a)
               for a in refused), text_of(refused[0])
    # Those of another conversation, or of a client gone, are not in its list: the refusal names the way to all.
    assert all(f"stop --state {state}" in text_of(a) and "outlive" in text_of(a) for a in refused), text_of(refused[0])


def test_the_day_cap_counts_starts_and_says_when_a_place_frees(servers, files, state):
    server = servers(background_argv(files, state, per_day="2"))
    server.initialize()
    for _ in range(2):
        wait_ended(state, start(server, program="true"))
    result = server.call("start", {"program": "true"}, meta=META)
    assert result.get("isError") is True
    assert "the most in a day" in text_of(result) and "a place frees up at" in text_of(result)


def test_starts_dated_ahead_by_a_clock_since_corrected_age_from_when_they_were_first_seen(servers, files, state):
    layout.ensure_state(str(state))
    two_days_ahead = time.time() + 2 * 86400  # written while the wall clock was two days ahead
    (state / layout.STARTS).write_text(f"{two_days_ahead:.3f}\n{two_days_ahead + 60:.3f}\n")
    server = servers(background_argv(files, state, per_day="2"))
    server.initialize()

    def frees_at() -> str:
        result = server.call("start", {"program": "true"}, meta=META)
        assert result.get("isError") is True, text_of(result)
        return text_of(result).rsplit("a place frees up at ", 1)[1]

    first_seen = time.time()
    first = frees_at()
    assert all(float(line) <= time.time() for line in (state / layout.STARTS).read_text().split())
    assert abs(datetime.fromisoformat(first).timestamp() - (first_seen + 86400)) < 5, first  # a day from now
    second = int(time.time()) + 1
    wait_for(lambda: time.time() >= second, what="the next second of the wall clock")
    assert frees_at() == first  # the time named does not move on with each try


def test_list_shows_this_conversations_commands_newest_first(bg, state):
    first = start(bg, program="true")
    wait_ended(state, first)
    second = start(bg, program="sh", args=["-c", "echo hi"])
    wait_ended(state, second)
    value = bg.call("list", {}, meta=META)["structuredContent"]
    assert [c["id"] for c in value["commands"]] == [second, first]
    entry = value["commands"][0]
    assert entry["program"] == "sh" and entry["args"] == ["-c", "echo hi"] and entry["bytes"] == 3
    assert entry["state"] == "exited" and entry["told"] == "no way in"


SCRIPT = "import sys\nfor line in sys.stdin:\n\tprint(line)\n"  # a multi-line python3 -c, as agents write them


def test_list_shows_each_command_on_one_line_with_its_control_characters_escaped_and_no_way_in_said_once(bg, state):
    started = bg.call("start", {"program": "python3", "args": ["-c", SCRIPT], "input": "x\n"}, meta=META)
    first = started["structuredContent"]["id"]
    assert text_of(started).splitlines()[0] == (
        f"Started {first}: python3 -c $'import sys\\nfor line in sys.stdin:\\n\\tprint(line)\\n'")
    wait_ended(state, first)
    second = start(bg, program="sh", args=["-c", "echo 'a b'\x1b[2K"])
    wait_ended(state, second)
    result = bg.call("list", {}, meta=META)
    lines = text_of(result).splitlines()
    assert len(lines) == 5, lines  # each command's two lines, then the one note
    assert lines[1] == "  sh -c $'echo \\'a b\\'\\x1b[2K'  (in .)", lines[1]
    assert lines[3] == "  python3 -c $'import sys\\nfor line in sys.stdin:\\n\\tprint(line)\\n'  (in .)", lines[3]
    assert not any("told:" in line for line in lines[:4]), lines
    assert "(told: no way in)" in lines[4] and "read with wait" in lines[4], lines[4]
    # The structured value keeps each command as it was given, and its told.
    entries = result["structuredContent"]["commands"]
    assert [(e["args"], e["told"]) for e in entries] == [
        (["-c", "echo 'a b'\x1b[2K"], "no way in"), (["-c", SCRIPT], "no way in")]


def test_a_background_tool_called_while_they_are_off_says_how_to_turn_them_on(servers, files, state):
    off = servers(serve_argv(files))
    off.initialize()
    for tool in ("start", "list", "read", "write", "stop"):
        message = off.request("tools/call", {"name": tool, "arguments": {}})["error"]["message"]
        assert message.startswith(f"Unknown tool: {tool} (tools: command); background commands are off"), message
        assert "up --no-way-in" in message and "--way-in <address> --as <agent id>" in message, message
    other = off.request("tools/call", {"name": "frobnicate", "arguments": {}})["error"]["message"]
    assert other == "Unknown tool: frobnicate (tools: command)"
    none_at_once = servers(background_argv(files, state, running="0"))
    none_at_once.initialize()
    message = none_at_once.request("tools/call", {"name": "start", "arguments": {}})["error"]["message"]
    assert "background = 0" in message and "spec" in message and "start the agent again" in message, message


def test_an_old_record_still_loads(tmp_path):
    # A record of format version 1, as written by this version: a format change must keep reading it.
    fixture = Path(__file__).parent / "data" / "record-v1.json"
    record = orjson.loads(fixture.read_bytes())
    assert record["v"] == 1
    assert set(record) >= {"v", "argv", "write", "proxy", "folder", "program", "args", "started", "timeout",
                           "output", "background_output", "keep", "way_in", "as", "keyring", "thread", "hops",
                           "state", "group", "leader_pid", "leader_start", "boot_id", "inode", "kept_from",
                           "bytes", "ended", "exit", "signal", "told", "first_try", "sweep_first_try", "told_at"}


def test_a_state_folder_on_a_network_filesystem_is_refused(tmp_path, files):
    mountinfo = (f"22 27 0:21 / / rw - ext4 /dev/sda1 rw\n"
                 f"40 22 0:50 / {tmp_path} rw - nfs4 server:/export rw\n")
    assert layout.filesystem_of(str(tmp_path / "state"), mountinfo) == "nfs4"
    assert layout.filesystem_of("/", mountinfo) == "ext4"
    # And serve refuses to start on what this machine's mounts say, for a local one it starts.
    done = subprocess.run(background_argv(files, tmp_path / "state"), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr


def test_star_refuses_an_absolute_program_not_visible_in_the_sandbox(tmp_path):
    from linkrun.errors import Refused
    from linkrun.sandboxing.programs import Programs

    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    sandbox = ("/usr/bin/bwrap", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin")
    programs = Programs(("*",), "/usr/bin:/bin", sandbox)
    assert programs.resolve("/usr/bin/env") == "/usr/bin/env"
    with pytest.raises(Refused, match="not visible in the sandbox"):
        programs.resolve(str(tool))
    assert Programs(("*",), "/usr/bin:/bin", ("/usr/bin/env",)).resolve(str(tool)) == str(tool)


def test_a_read_and_a_list_open_background_once_a_call(files, state, monkeypatch):
    """However many records a list shows and however many passes a waiting read makes."""
    from linkrun.sandboxing import beneath
    from linkrun import config
    from linkrun.detached.background import Background

    settings = config.parse_serve(background_argv(files, state)[len(SERVER) + 1:])
    files_fd = os.open(files, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    background = Background(settings, lambda: files_fd)
    os.close(background.background_folder())
    layout.ensure_state(str(state))
    locks = []
    for _ in range(3):  # running, as its supervisor's held lock says
        command_id = records.new_id()
        locks.append(records.create_lock(str(state), command_id))
        record = records.new_record(command_id, argv=[], write=[], proxy=None, seccomp=None, files=str(files),
                                    folder="", program="sleep", args=["60"], program_argv=[], timeout=60,
                                    output=16384, background_output=16384, keep=60, way_in=None, agent=None,
                                    keyring=None, thread=META["link.local/thread"], hops=0, limits=None)
        record["state"] = records.State.RUNNING
        records.write(str(state), command_id, record)
    opened: list[str] = []
    open_folder = beneath.open_folder
    monkeypatch.setattr(beneath, "open_folder", lambda fd, path: opened.append(path) or open_folder(fd, path))
    try:
        assert len(background.list(META)) == 3
        assert opened == [layout.BACKGROUND]
        opened.clear()
        background.read({"id": command_id}, META, 0.3)  # passes until its wait is over
        assert opened == [layout.BACKGROUND]
    finally:
        for fd in locks + [files_fd]:
            os.close(fd)


def test_list_shows_a_long_command_line_by_its_start_and_the_structured_value_has_it_whole(bg, state):
    # A new user's trial: a long script filled list with itself, once for each of its commands.
    script = "print(1)  # " + "y" * 400
    command_id = start(bg, program="python3", args=["-c", script])
    wait_ended(state, command_id)
    result = bg.call("list", {}, meta=META)
    line = text_of(result).splitlines()[1]
    shown = f"python3 -c '{script}'"
    assert line == f"  {shown[:200]}… ({len(shown) - 200} characters more)  (in .)", line
    assert result["structuredContent"]["commands"][0]["args"] == ["-c", script]


def test_read_and_write_give_how_it_ended_in_the_structured_value_as_list_does(bg, state):
    # A second new user's trial: a structured-first model saw "exited" and no exit status unless it called list,
    # and a read with a pattern lost the status from its text too.
    command_id = start(bg, program="sh", args=["-c", "echo hi; exit 7"])
    wait_ended(state, command_id)
    value = bg.call("read", {"id": command_id}, meta=META)["structuredContent"]
    assert (value["state"], value["exit"], value["signal"], value["limit"]) == ("exited", 7, None, None), value
    found = bg.call("read", {"id": command_id, "pattern": "nothing"}, meta=META)
    assert found["structuredContent"]["exit"] == 7, found["structuredContent"]
    assert f"{command_id} · exited (exit 7) · lines matching" in text_of(found), text_of(found)
    running = start(bg, program="sleep", args=["30"])
    assert "exit" not in bg.call("read", {"id": running}, meta=META)["structuredContent"]
    bg.call("stop", {"id": running}, meta=META)

"""`write`: text to a running background command's input through its
supervisor, its answer in the reply, and waiting for input shown; with real
supervisors, through a pass-through sandbox, then in the real sandbox as root
and as an ordinary user."""

from __future__ import annotations

import os
import secrets
import signal
import stat
import time

import pytest

from background_helpers import META, OTHER, background_argv, start, wait_ended, wait_running
from conftest import parent_of, pid_alive, text_of, wait_for
from node_helpers import NODE_DIR, need_node

from linkrun.detached import input as program_input
from linkrun.state import layout
from up_harness import META as UP_META, processes_with

def write(server, meta=META, **arguments: object) -> dict:
    """A write's answer, which must not be an error."""
    result = server.call("write", arguments, meta=meta)
    assert "isError" not in result, text_of(result)
    return result["structuredContent"]


def refusal(server, meta=META, **arguments: object) -> str:
    result = server.call("write", arguments, meta=meta)
    assert result.get("isError"), text_of(result)
    return text_of(result)


def listed(server, command_id: str) -> dict:
    entries = server.call("list", {}, meta=META)["structuredContent"]["commands"]
    return next(e for e in entries if e["id"] == command_id)


def test_a_written_line_is_answered_in_the_writes_reply(bg, state):
    command_id = start(bg, program="sh", args=["-c", "read x; echo got $x; read y; echo then $y"])
    wait_running(state, command_id)
    wait_for(lambda: listed(bg, command_id)["waiting"], what="the shell to wait for its input")
    socket_file = (state / (command_id + layout.WRITE)).stat()
    assert stat.S_ISSOCK(socket_file.st_mode) and stat.S_IMODE(socket_file.st_mode) == 0o600
    first = write(bg, id=command_id, text="it\n", wait=10)
    assert (first["text"], first["offset"], first["written"]) == ("got it\n", 0, 3)
    second = write(bg, id=command_id, text="more\n", wait=10)
    assert (second["text"], second["offset"]) == ("then more\n", first["next"])
    ended = wait_ended(state, command_id)
    assert ended["exit"] == 0
    assert not (state / (command_id + layout.WRITE)).exists()


def test_python_keeps_a_variable_across_three_writes(bg, state):
    command_id = start(bg, program="python3", args=["-u", "-i", "-q"])
    write(bg, id=command_id, text="x = 20\n", wait=0)
    write(bg, id=command_id, text="x += 22\n", wait=0)
    answer = write(bg, id=command_id, text="print('x is', x)\n", wait=10)
    seen = answer["text"]
    while "x is 42" not in seen:  # the prompts come on the same stream, in any order of writes
        more = bg.call("read", {"id": command_id, "offset": answer["next"], "wait": 10}, meta=META)
        assert more["structuredContent"]["next"] > answer["next"], seen
        answer = more["structuredContent"]
        seen += answer["text"]
    write(bg, id=command_id, eof=True, wait=0)
    assert wait_ended(state, command_id)["exit"] == 0


def test_bytes_go_as_given_and_eof_closes_the_input(bg, state):
    command_id = start(bg, program="sh", args=["-c", "od -An -tx1"])
    answer = write(bg, id=command_id, text="\u0003\u001b[A é", eof=True, wait=10)
    assert "written" in answer
    ended = wait_ended(state, command_id)
    assert ended["exit"] == 0
    text = bg.call("read", {"id": command_id, "offset": 0}, meta=META)["structuredContent"]["text"]
    assert text.split() == ["03", "1b", "5b", "41", "20", "c3", "a9"]


def test_another_conversations_id_is_unknown_and_nothing_is_written(bg, state):
    command_id = start(bg, program="sh", args=["-c", "read x; echo got $x"])
    wait_running(state, command_id)
    said = refusal(bg, OTHER, id=command_id, text="intruder\n")
    assert "no command of this conversation's" in said
    answer = write(bg, id=command_id, text="owner\n", wait=10)
    assert answer["text"] == "got owner\n"


def test_an_ended_command_and_a_closed_input_are_refused(bg, state):
    command_id = start(bg, program="sh", args=["-c", "read x; echo got $x"])
    write(bg, id=command_id, text="one\n", eof=True, wait=10)
    wait_ended(state, command_id)
    assert "has ended, exited (exit 0): it takes no more input" in refusal(bg, id=command_id, text="two\n")
    given = start(bg, program="sleep", args=["30"], input="x\n")
    wait_running(state, given)
    assert "it was given its input at start" in refusal(bg, id=given, text="y\n")
    closed = start(bg, program="sleep", args=["30"])
    write(bg, id=closed, eof=True, wait=0)
    assert "its input is closed" in refusal(bg, id=closed, text="z\n")


def test_a_write_after_its_supervisor_was_killed_is_refused_and_the_command_swept(bg, state):
    # Five times: serve's own sweep of the lost command may hold its record
    # when the write comes (seen about once in fifteen); the write waits for
    # it and says how the command ended, not that it "is ending".
    for _ in range(5):
        command_id = start(bg, program="sh", args=["-c", "read x; echo got $x"])
        supervisor = parent_of(wait_running(state, command_id)["leader_pid"])
        os.kill(supervisor, signal.SIGKILL)
        wait_for(lambda supervisor=supervisor: not pid_alive(supervisor), what="the supervisor to die")
        said = refusal(bg, id=command_id, text="late\n")
        assert "has ended, lost" in said and "it takes no more input" in said, said


def test_a_held_write_hears_when_its_answer_is_in_the_output_file(bg, state):
    """The supervisor answers a held write a second time once the program's output after it is in the
    file (serve then reads once, without a watch); no second answer without output, nor at the end."""
    command_id = start(bg, program="sh", args=["-c", "read x; echo got $x; read y; read z"])
    wait_running(state, command_id)
    held = program_input.ask(str(state), command_id, {"op": "write", "eof": False}, b"it\n", hold=30)
    assert held == {"taken": 3, "output": True}
    assert bg.call("read", {"id": command_id, "offset": 0}, meta=META)["structuredContent"]["text"] == "got it\n"
    silent = program_input.ask(str(state), command_id, {"op": "write", "eof": False}, b"y\n", hold=0.2)
    assert silent == {"taken": 2}
    began = time.monotonic()
    last = program_input.ask(str(state), command_id, {"op": "write", "eof": False}, b"z\n", hold=30)
    assert last == {"taken": 2} and time.monotonic() - began < 10  # let go at its end, not held 30 s
    assert wait_ended(state, command_id)["exit"] == 0


def test_a_command_that_does_not_read_is_not_waiting(bg, state):
    command_id = start(bg, program="sleep", args=["30"])
    wait_running(state, command_id)
    assert listed(bg, command_id)["waiting"] is False
    reader = start(bg, program="sh", args=["-c", "read x"])
    wait_for(lambda: listed(bg, reader)["waiting"], what="the reader to wait")
    read = bg.call("read", {"id": reader}, meta=META)
    assert "waiting for input" in text_of(read)


def up_write(up, **arguments: object) -> dict:
    result = up.server.call("write", arguments, meta=UP_META, timeout=60)
    assert not result.get("isError"), text_of(result)
    return result["structuredContent"]


def answered(up, command_id: str, answer: dict, wanted: str) -> str:
    """The output from the answer's offset until `wanted` shows."""
    seen, offset = answer["text"], answer["next"]
    while wanted not in seen:
        value, _ = up.read(command_id, offset, wait=10)
        assert value["next"] > offset, seen
        seen, offset = seen + value["text"], value["next"]
    return seen


def test_in_the_sandbox_a_python_session_keeps_its_state_and_a_prompt_is_answered(up_as):
    up = up_as
    session = up.start("python3", "-u", "-i", "-q")
    for line in ("x = 20\n", "x += 22\n"):
        up_write(up, id=session, text=line, wait=0)
    assert "x is 42" in answered(up, session, up_write(up, id=session, text="print('x is', x)\n", wait=10), "x is 42")
    prompt = up.start("sh", "-c", "read x; echo got $x")
    wait_for(lambda: up.read(prompt)[0]["waiting"], what="the prompt to wait for its input")
    assert answered(up, prompt, up_write(up, id=prompt, text="it\n", wait=10), "got it") == "got it\n"
    up.wait_ended(prompt)
    ended = up.server.call("write", {"id": prompt, "text": "again\n"}, meta=UP_META)
    assert ended.get("isError") and "it takes no more input" in text_of(ended)
    other = up.server.call("write", {"id": session, "text": "x = 0\n"}, meta=OTHER)
    assert other.get("isError") and "no command of this conversation's" in text_of(other)
    plain = up.start("python3", "-c", "import sys; print('a terminal' if sys.stdin.isatty() else 'no terminal')")
    up.wait_ended(plain)
    assert up.read_all(plain).endswith("no terminal\n")
    up_write(up, id=session, eof=True, wait=0)
    up.wait_ended(session)


def up_start(up, program: str, *args: str, **arguments: object) -> str:
    result = up.server.call("start", {"program": program, "args": list(args), **arguments}, meta=UP_META, timeout=60)
    assert not result.get("isError"), text_of(result)
    return result["structuredContent"]["id"]


ON_A_TERMINAL = """
import fcntl, os, sys, termios
print('a terminal' if sys.stdin.isatty() else 'no terminal', os.get_terminal_size(0))
print('pts', sorted(os.listdir('/dev/pts')))
for name, request, argument in (('TIOCSTI', termios.TIOCSTI, b'x'), ('TIOCLINUX', 0x541C, bytes([6, 0]))):
    try:
        fcntl.ioctl(0, request, argument)
        print(name, 'taken')
    except OSError as problem:
        print(name, 'refused', problem.errno)
"""


def test_in_the_sandbox_a_tty_command_has_a_terminal_of_its_own_and_ctrl_c_reaches_it(up_as):
    up = up_as
    probe = up_start(up, "python3", "-c", ON_A_TERMINAL, tty=True, columns=100, rows=30)
    up.wait_ended(probe)
    printed = up.read_all(probe)
    assert "a terminal os.terminal_size(columns=100, lines=30)\r\n" in printed
    assert "pts ['0', 'ptmx']\r\n" in printed  # the sandbox's own devpts: its one terminal, none of the host's
    assert "TIOCSTI refused 1\r\n" in printed and "TIOCLINUX refused 1\r\n" in printed  # EPERM: the filter
    shell = up_start(up, "sh", tty=True)
    wait_for(lambda: up.read(shell)[0]["waiting"], what="the shell to wait at its prompt")
    # Not "no longer waiting": the shell reads the line before sleep runs, and a
    # Ctrl-C then reaches the shell alone, which goes on to run sleep.
    seconds = f"100.{secrets.randbelow(10**6):06d}"  # sleep's own command line, found among the host's processes
    up_write(up, id=shell, text=f"sleep {seconds}\n", wait=0)
    wait_for(lambda: processes_with(f"sleep\0{seconds}"), what="sleep to run")
    up_write(up, id=shell, text="\u0003", wait=0)
    wait_for(lambda: up.read(shell)[0]["waiting"], what="the shell to be back at its prompt")
    assert "alive" in answered(up, shell, up_write(up, id=shell, text="echo ali''ve\n", wait=10), "alive\r\n")
    up_write(up, id=shell, text="exit 7\n", wait=0)
    up.wait_ended(shell)
    assert "exit 7" in up.read(shell)[1]


def test_a_python_prompt_on_a_terminal_is_seen_waiting_though_it_waits_in_select(up_as):
    # Python's readline waits for its terminal in select() on it alone, not in a read.
    up = up_as
    session = up_start(up, "python3", "-q", tty=True)
    wait_for(lambda: up.read(session)[0]["waiting"], what="the prompt to be seen waiting")
    assert "42" in answered(up, session, up_write(up, id=session, text="print(6 * 7)\n", wait=10), "42\r\n")
    wait_for(lambda: up.read(session)[0]["waiting"], what="the prompt to be seen waiting again")
    # Waiting in select() on nothing, or on more than its input, is not waiting for it.
    sleeper = up_start(up, "python3", "-c", "import select, sys; print('in', flush=True); "
                       "select.select([], [], [], 60)", tty=True)
    wait_for(lambda: "in\r\n" in up.read_all(sleeper), what="the sleeper to select")
    assert up.read(sleeper)[0]["waiting"] is False
    up_write(up, id=session, text="exit()\n", wait=0)
    up.wait_ended(session)


def test_stop_of_a_tty_command_gives_its_program_the_sigterm_and_keeps_what_it_said(up_as):
    up = up_as
    command_id = up_start(up, "sh", "-c", "trap 'echo got TERM; exit 0' TERM; echo up; while :; do sleep 0.1; done",
                          tty=True)
    wait_for(lambda: "up\r\n" in up.read_all(command_id), what="the program in its loop")
    stopped = up.server.call("stop", {"id": command_id}, meta=UP_META, timeout=60)
    assert not stopped.get("isError"), text_of(stopped)
    up.wait_ended(command_id)
    printed = up.read_all(command_id)
    # The program's own session on its terminal got the TERM, not the terminal's keeper (util-linux script),
    # whose SIGTERM handler keeps what the program then says and kills it after two seconds.
    assert "got TERM\r\n" in printed and "Session terminated" not in printed, printed
    assert f"{command_id} · stopped (exit 0) ·" in printed, printed  # its trap's exit, not a kill


def test_the_instructions_and_starts_input_point_a_prompt_to_start_tty_and_write(servers, files, state):
    server = servers(background_argv(files, state))
    instructions = server.initialize()["instructions"]
    assert "gets none from command" in instructions and "with tty" in instructions and "write types" in instructions
    tools = {tool["name"]: tool for tool in server.request("tools/list", {})["result"]["tools"]}
    assert {"write", "start", "command"} <= set(tools)
    assert "tty" in tools["start"]["inputSchema"]["properties"]
    assert "tty" not in tools["command"]["inputSchema"]["properties"]
    assert "stays open for write" in tools["start"]["inputSchema"]["properties"]["input"]["description"]


def test_a_write_answers_with_all_it_printed_until_it_waits_for_input_again(bg, state):
    # A new user's trial: the answer was the first bytes only ("got "), the rest left for a read.
    command_id = start(bg, program="sh", args=["-c", "read x; printf 'got '; sleep 0.3; echo \"$x\"; "
                                               "read y; printf 'then '; sleep 0.3; echo \"$y\"; read z"])
    wait_for(lambda: listed(bg, command_id)["waiting"], what="the shell to wait for its input")
    first = write(bg, id=command_id, text="it\n", wait=10)
    assert (first["text"], first["waiting"]) == ("got it\n", True)
    second = write(bg, id=command_id, text="more\n", wait=10)
    assert (second["text"], second["offset"], second["waiting"]) == ("then more\n", first["next"], True)
    write(bg, id=command_id, text="done\n", eof=True, wait=0)
    assert wait_ended(state, command_id)["exit"] == 0


def test_a_write_to_a_program_that_prints_and_reads_no_more_answers_once_it_is_quiet(bg, state):
    command_id = start(bg, program="sh", args=["-c", "read x; echo a; sleep 0.2; echo b; exec sleep 60"])
    wait_for(lambda: listed(bg, command_id)["waiting"], what="the shell to wait for its input")
    began = time.monotonic()
    answer = write(bg, id=command_id, text="go\n", wait=20)
    assert (answer["text"], answer["waiting"]) == ("a\nb\n", False)
    assert time.monotonic() - began < 10, "it waited for the whole wait, not for the output to settle"
    bg.call("stop", {"id": command_id}, meta=META)
    wait_ended(state, command_id)


def test_a_write_on_a_terminal_answers_with_the_programs_reply_not_only_its_echo(up_as):
    up = up_as
    session = up_start(up, "python3", "-q", tty=True)
    wait_for(lambda: up.read(session)[0]["waiting"], what="the prompt to be seen waiting")
    answer = up_write(up, id=session, text="print(6 * 7)\n", wait=10)
    assert "42\r\n>>> " in answer["text"] and answer["waiting"], answer
    # Silent for a second after the echo: at work, not done.
    answer = up_write(up, id=session, text="import time; time.sleep(1); print('slept')\n", wait=10)
    assert "slept\r\n>>> " in answer["text"] and answer["waiting"], answer
    up_write(up, id=session, text="exit()\n", wait=0)
    up.wait_ended(session)


# An event loop's prompt: asyncio waits for its input in epoll_wait(), beside a socket of its own for wake-ups.
EVENT_LOOP_PROMPT = """
import asyncio, sys
async def main():
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        print('? ', end='', flush=True)
        line = await reader.readline()
        if not line:
            return
        print('working', flush=True)
        await asyncio.sleep(0.3)  # at work: its epoll_wait has a timeout, the timer's, and its input in its set
        print('got', line.decode().strip(), flush=True)
asyncio.run(main())
"""


def test_a_program_waiting_in_its_event_loop_is_seen_waiting_and_answered_at_once(bg, state):
    # A new user's trial: Node's REPL was never seen waiting, so its writes waited out the quiet.
    command_id = start(bg, program="python3", args=["-c", EVENT_LOOP_PROMPT])
    wait_for(lambda: listed(bg, command_id)["waiting"], what="the event loop to wait for its input")
    began = time.monotonic()
    answer = write(bg, id=command_id, text="it\n", wait=10)
    assert (answer["text"], answer["waiting"]) == ("working\ngot it\n? ", True), answer
    assert time.monotonic() - began < 0.8 + 0.3, "it waited out the quiet, not for the prompt"
    # An event loop waiting on a timer alone, its input not among what it waits for, is not waiting for it.
    sleeper = start(bg, program="python3", args=["-c", "import asyncio; print('in', flush=True); "
                                                 "asyncio.run(asyncio.sleep(60))"])
    wait_for(lambda: "in" in bg.call("read", {"id": sleeper}, meta=META)["structuredContent"]["text"],
             what="the sleeper to wait")
    assert listed(bg, sleeper)["waiting"] is False
    for ended in (command_id, sleeper):
        bg.call("stop", {"id": ended}, meta=META)
        wait_ended(state, ended)


# A prompt as npm init and the other Node tools ask it: readline, waited for in libuv's epoll_wait().
NODE_PROMPTS = """
const rl = require('readline').createInterface({input: process.stdin, output: process.stdout});
rl.question('Project name: ', (name) => setTimeout(() => {
    console.log('made ' + name);
    rl.question('Version: ', (version) => { console.log('version ' + version); rl.close(); });
}, 300));
"""


def test_in_the_sandbox_a_node_prompt_on_a_terminal_is_seen_waiting_and_its_answer_is_whole(up_as):
    need_node(NODE_DIR, "tests/node is missing", sandboxed=True)
    up = up_as
    session = up_start(up, "node", "-e", NODE_PROMPTS, tty=True)
    found = up.server.call("read", {"id": session, "pattern": "^Project name: ", "wait": 30}, meta=UP_META,
                           timeout=60)
    assert found["structuredContent"]["until"] == "match", text_of(found)
    assert "a prompt matched" in text_of(found)
    # Node at work on its timer (a timeout in its epoll_wait) is not waiting: the answer runs to the next prompt.
    answer = up_write(up, id=session, text="demo\n", wait=10)
    assert answer["text"].startswith("demo") and answer["text"].endswith("\nmade demo\r\nVersion: "), answer
    assert answer["waiting"], answer
    assert "version 1.0\r\n" in answered(up, session, up_write(up, id=session, text="1.0\n", wait=10),
                                         "version 1.0\r\n")
    up.wait_ended(session)


# Python buffers what it prints to a pipe until its buffer fills or it ends.
PRINTS_THEN_SLEEPS = "import time; print('ready'); time.sleep(60)"


def test_in_the_sandbox_what_python_printed_is_there_before_it_ends(up_as):
    # A new user's trial: `python3 -m http.server` started without -u was never seen "Serving", and stopped,
    # it had printed 0 bytes; a call cut by its timeout lost all it had printed the same way.
    up = up_as
    server = up.start("python3", "-c", PRINTS_THEN_SLEEPS)
    found = up.server.call("read", {"id": server, "pattern": "^ready$", "wait": 20}, meta=UP_META, timeout=60)
    assert found["structuredContent"]["until"] == "match", text_of(found)
    up.server.call("stop", {"id": server}, meta=UP_META, timeout=60)
    cut = up.server.call("command", {"program": "python3", "args": ["-c", PRINTS_THEN_SLEEPS], "timeout": 2},
                         meta=UP_META, timeout=60)
    assert cut["structuredContent"]["timed_out"] is True and "ready\n" in text_of(cut), text_of(cut)


def test_a_write_taken_silently_is_answered_once_the_program_waits_again_not_at_the_end_of_its_wait(bg, state):
    # A second new user's trial: a write to a program that printed nothing in reply waited its whole wait (12 s).
    command_id = start(bg, program="python3", args=["-c", "import sys\nfor line in sys.stdin: pass"])
    wait_for(lambda: listed(bg, command_id)["waiting"], what="the program to wait for its input")
    began = time.monotonic()
    answer = write(bg, id=command_id, text="a\n", wait=12)
    assert (answer["text"], answer["waiting"]) == ("", True), answer
    assert time.monotonic() - began < 6, "it waited for the whole wait, not for the program to wait again"
    write(bg, id=command_id, text="", eof=True, wait=0)
    assert wait_ended(state, command_id)["exit"] == 0


@pytest.mark.parametrize("late, skipped", [("echo late", False), ("printf '%5000s\\n' late", True)])
def test_what_a_program_printed_between_two_writes_begins_the_next_writes_answer_up_to_a_few_lines(
        bg, state, files, late, skipped):
    # A second new user's trial: npm init's "license: (ISC) " prompt, late to the output file, was in no answer,
    # and the model typed its answer blind: a write answered from where the output had got to, not from the last
    # answer. More than a prompt's few lines is left for a read, so that the write's own reply stays in its answer.
    command_id = start(bg, program="sh", args=["-c", f"read x; echo \"got $x\"; (sleep 0.3; {late}) & "
                                               "read y; echo \"then $y\""])
    wait_for(lambda: listed(bg, command_id)["waiting"], what="the shell to wait for its input")
    first = write(bg, id=command_id, text="a\n", wait=10)
    assert first["text"] == "got a\n", first
    output = files / "background" / f"{command_id}.out"
    wait_for(lambda: b"late" in output.read_bytes(), what="the late line")
    second = write(bg, id=command_id, text="b\n", wait=10)
    late_bytes = output.read_bytes()[first["next"]:].split(b"then b")[0].decode()
    expected = (first["next"] + len(late_bytes), "then b\n") if skipped else (first["next"], late_bytes + "then b\n")
    assert (second["offset"], second["text"]) == expected, second
    assert wait_ended(state, command_id)["exit"] == 0


def test_on_a_terminal_a_pattern_ending_a_line_is_told_of_the_terminals_carriage_return(up_as):
    # A second new user's trial: '^ready$' never matched a terminal's "ready\r\n", and nothing said why.
    up = up_as
    command_id = up_start(up, "sh", "-c", "echo ready; sleep 30", tty=True)
    missed = up.server.call("read", {"id": command_id, "pattern": "^ready$", "wait": 1}, meta=UP_META, timeout=60)
    assert r"end the pattern with \r?$ for a line's end" in text_of(missed), text_of(missed)
    found = up.server.call("read", {"id": command_id, "pattern": r"^ready\r?$", "wait": 10}, meta=UP_META,
                           timeout=60)
    assert found["structuredContent"]["until"] == "match", text_of(found)
    up.server.call("stop", {"id": command_id}, meta=UP_META, timeout=60)


def test_ctrl_c_written_without_a_terminal_is_said_to_be_a_plain_byte(bg, state):
    # A second new user's trial: \u0003 to a loop without tty answered "wrote 1 bytes", and the loop went on.
    command_id = start(bg, program="sh", args=["-c", "read x; echo got"])
    wait_for(lambda: listed(bg, command_id)["waiting"], what="the shell to wait for its input")
    result = bg.call("write", {"id": command_id, "text": "\u0003\n", "wait": 5}, meta=META)
    assert "its \\u0003 went as a plain byte: without tty" in text_of(result), text_of(result)
    assert "wrote 2 bytes" in text_of(result), text_of(result)
    assert wait_ended(state, command_id)["exit"] == 0
    one = start(bg, program="sh", args=["-c", "read x; echo got"])  # a fourth trial: "wrote 1 bytes"
    wait_for(lambda: listed(bg, one)["waiting"], what="the shell to wait for its input")
    wrote = text_of(bg.call("write", {"id": one, "text": "\n", "wait": 5}, meta=META))
    assert "wrote 1 byte" in wrote and "wrote 1 bytes" not in wrote, wrote


def test_a_write_waiting_for_its_first_output_reports_its_progress_from_the_write_at_a_pace(bg, state):
    command_id = start(bg, program="sh", args=["-c", "read x; sleep 1.5; echo done; read y"])
    wait_for(lambda: listed(bg, command_id)["waiting"], what="the shell to wait for its input")
    bg.send({"jsonrpc": "2.0", "id": "w", "method": "tools/call", "params": {
        "name": "write", "arguments": {"id": command_id, "text": "a\n", "wait": 10},
        "_meta": {**META, "progressToken": "p"}}})
    ticks = []
    while True:
        message = bg.next_message(timeout=30)
        if message.get("method") == "notifications/progress":
            ticks.append(message["params"])
        elif message.get("id") == "w":
            assert message["result"]["structuredContent"]["text"] == "done\n", message
            break
    # Each from the write (its total the write's wait), rising, a few a second: not one per look.
    assert ticks and all(tick["total"] == 10 for tick in ticks), ticks
    assert [tick["progress"] for tick in ticks] == sorted(tick["progress"] for tick in ticks), ticks
    assert len(ticks) <= 1.5 / 0.25 + 4, ticks
    bg.call("stop", {"id": command_id}, meta=META)

"""tools/bench's `write` group: a `write` of one line to an echoing command,
from the call to its answer holding the echo, through serve, the supervisor's
socket, the program's pipe (or terminal) and its output file.

Goal: at most 5 ms beyond the program's own time. The baseline, in the same
run and interleaved with ours: the same line written to the same program
(`cat`, or `cat` on a terminal through util-linux's script) started directly,
its echo read from its own pipe; and an MCP ping's round trip. The first
write after a start, which also waits for the program to come up, is shown
apart.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

ROUNDS = 200


def percentile_ms(samples: list[float], part: float) -> float:
    ordered = sorted(samples)
    return 1000 * ordered[min(len(ordered) - 1, int(part * len(ordered)))]


def direct_round_trip(argv: list[str], line: bytes) -> Callable[[], float]:
    """The program started directly: seconds from a line written to its pipe to its echo read back."""
    program = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    assert program.stdin is not None and program.stdout is not None
    stdin, stdout = program.stdin, program.stdout

    def once() -> float:
        t = time.perf_counter()
        stdin.write(line)
        got = b""
        while not got.endswith(b"\n") or line.strip() not in got:
            got += os.read(stdout.fileno(), 4096)
        return time.perf_counter() - t

    once.program = program  # type: ignore[attr-defined]
    return once


def interactive(files: str, tools: dict[str, Any]) -> None:
    Server, background_argv, call, INIT, row, figure, load_record, wait_until = (
        tools[name] for name in ("Server", "background_argv", "call", "INIT", "row", "figure", "load_record",
                                 "wait_until"))
    print("write: a line to an echoing background command, round trip to its answer in the write's reply")
    state = tempfile.mkdtemp(prefix="state-", dir=os.path.dirname(files))
    server = Server(background_argv(files, state))
    server.send(INIT)
    server.wait(0)
    request = iter(range(1, 1 << 30))
    # On a terminal, its echo is off in both: else the terminal's echo of the line answers first, and
    # the program's own echo comes after the write's answer, into the next one's.
    cases = (("a pipe (cat)", {"program": "cat"}, ["cat"]),
             ("a terminal (cat, tty)", {"program": "sh", "args": ["-c", "stty -echo; exec cat"], "tty": True},
              ["/usr/bin/script", "-qefc", "stty -echo; exec cat", "/dev/null"]))
    for what, start, direct_argv in cases:
        command_id = call(server, next(request), "start", start)["structuredContent"]["id"]
        wait_until(lambda command_id=command_id: (load_record(state, command_id) or {}).get("state") == "running")
        direct = direct_round_trip(direct_argv, b"hello 0\n")
        first_direct = direct()
        # The first write after start waits for the program to come up (and the supervisor to reach its
        # loop): shown apart, with the program's own first round trip, not in the steady figures.
        t = time.perf_counter()
        answer = call(server, next(request), "write", {"id": command_id, "text": "first\n", "wait": 5})
        first = time.perf_counter() - t
        assert "first" in answer["structuredContent"]["text"], answer
        ours, theirs, pings = [], [], []
        for index in range(ROUNDS):
            line = f"hello {index}\n"
            t = time.perf_counter()
            answer = call(server, next(request), "write", {"id": command_id, "text": line, "wait": 5})
            ours.append(time.perf_counter() - t)
            assert line.strip() in answer["structuredContent"]["text"], answer
            theirs.append(direct())
            t = time.perf_counter()
            ping = next(request)
            server.send({"jsonrpc": "2.0", "id": ping, "method": "ping"})
            server.wait(ping)
            pings.append(time.perf_counter() - t)
        direct.program.stdin.close()  # type: ignore[attr-defined]
        direct.program.wait()  # type: ignore[attr-defined]
        call(server, next(request), "stop", {"id": command_id})
        beyond = [a - b for a, b in zip(ours, theirs, strict=True)]
        median, p99 = percentile_ms(ours, 0.5), percentile_ms(ours, 0.99)
        baseline = (f"the program's own round trip: median {percentile_ms(theirs, 0.5):.2f} ms, p99 "
                    f"{percentile_ms(theirs, 0.99):.2f} ms; a ping: {statistics.median(pings) * 1000:.2f} ms")
        row(f"write → its echo in the reply, {what}", f"{median:.2f} / {p99:.2f} ms", "median / p99", baseline)
        row("  beyond the program's own time (median / p99)",
            f"{percentile_ms(beyond, 0.5):.2f} / {percentile_ms(beyond, 0.99):.2f} ms", "target ≤ 5 ms")
        row("  the first write after its start", f"{first * 1000:.2f} ms", "not in the above",
            f"the program's own first round trip: {first_direct * 1000:.2f} ms")
        figure(f"write → its echo in the reply, {what} (median / p99)", f"{median:.2f} / {p99:.2f} ms", baseline)
    server.close()
    subprocess.run(Server.__init__.__globals__["SERVER"] + ["remove", "--state", state], check=True)
    print(f"  load average at the end: {os.getloadavg()[0]:.2f}")

"""tools/bench's `lines` group: waiting on a line, and a supervisor telling lines.

- From a matching line printed to `read` with `wait` and `pattern` returning
  (goal: a median of at most 10 ms), beside a `read` with `wait` alone
  returning for the same kind of line, in the same run.
- A supervisor's pump with a `tell_on` pattern against the same pump
  without one (goal: at least 0.8× its speed).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

from bench import INIT, META, SERVER, Server, background_argv, load_record, median_ms, run_to_end, wait_until

ROUNDS = 20
PACE = 0.03  # between a read sent and the line printed: the read is waiting by then

# Prints one line per cue file, stamped with the clock the bench reads (CLOCK_MONOTONIC), then waits for the next.
PRINTER = ("import os, sys, time\n"
           "for n in range(int(sys.argv[1])):\n"
           "    while not os.path.exists(f'cue-{n}'): time.sleep(0.001)\n"
           "    sys.stdout.write(f'busy\\nlistening on {time.monotonic()!r}\\n'); sys.stdout.flush()\n")


def lines(files: str, row: Callable[..., None]) -> None:
    print("lines: waiting on a line, and a supervisor telling lines (pass-through sandbox)")
    wait_latency(files, row)


def wait_latency(files: str, row: Callable[..., None]) -> None:
    state = tempfile.mkdtemp(prefix="state-", dir=os.path.dirname(files))
    work = os.path.join(files, "work")
    server = Server(background_argv(files, state))
    server.send(INIT)
    server.wait(0)
    server.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "start", "arguments": {"program": "python3", "args": ["-c", PRINTER, str(2 * ROUNDS)],
                                       "folder": "work"}, "_meta": META}})
    command_id = server.wait(1)[1]["result"]["structuredContent"]["id"]
    wait_until(lambda: (load_record(state, command_id) or {}).get("state") == "running")
    took: dict[str, list[float]] = {"pattern": [], "plain": []}
    offset = 0
    for n in range(2 * ROUNDS):
        kind = "pattern" if n % 2 == 0 else "plain"
        arguments: dict = {"id": command_id, "wait": 10, "offset": offset}
        if kind == "pattern":
            arguments["pattern"] = "^listening on"
        request = 100 + n
        server.send({"jsonrpc": "2.0", "id": request, "method": "tools/call",
                     "params": {"name": "read", "arguments": arguments, "_meta": META}})
        time.sleep(PACE)
        open(os.path.join(work, f"cue-{n}"), "w").close()
        answered, message = server.wait(request)
        value = message["result"]["structuredContent"]
        if kind == "pattern":
            assert value["until"] == "match", value
            printed = float(value["lines"][0]["text"].split()[-1])
        else:
            # A plain read may return the first bytes alone: read on until the stamped line is whole.
            text, offset = value["text"], value["next"]
            while not text.endswith("\n") or "listening on" not in text:
                server.send({"jsonrpc": "2.0", "id": request + 1000, "method": "tools/call",
                             "params": {"name": "read", "arguments": {"id": command_id, "wait": 10, "offset": offset},
                                        "_meta": META}})
                answered, message = server.wait(request + 1000)
                text += message["result"]["structuredContent"]["text"]
                offset = message["result"]["structuredContent"]["next"]
            printed = float(text.split("listening on ")[1].split()[0])
        took[kind].append(answered - printed)
        offset = value["next"] if kind == "pattern" else offset
    server.close()
    subprocess.run(SERVER + ["remove", "--state", state], check=True)
    for name in os.listdir(work):
        if name.startswith("cue-"):
            os.unlink(os.path.join(work, name))
    pattern, plain = median_ms(took["pattern"]), median_ms(took["plain"])
    row("line printed → read wait+pattern answered (median)", f"{pattern:.1f} ms", "target ≤ 10 ms",
        f"read with wait alone, same run: {plain:.1f} ms ({pattern / plain:.2f}×)")


PUMP_BYTES = 1 << 30


def pump_with_tell_on(files: str, row: Callable[..., None]) -> None:
    """1 GiB of 64-byte lines pumped with a tell_on pattern (matching no line, so that only the
    scan is measured) against without, in interleaved rounds; a pump's time is its command's start
    to end less that of an empty command."""
    tell_on = os.environ.get("LNK_BENCH_TELL_ON", "1")
    if tell_on == "0":
        return
    state = tempfile.mkdtemp(prefix="state-", dir=os.path.dirname(files))
    server = Server(background_argv(files, state, output=str(2 * PUMP_BYTES)))
    server.send(INIT)
    server.wait(0)
    times: dict[str, list[float]] = {"without": [], "tell_on": []}
    script = f"yes '{'x' * 62}' | head -c {PUMP_BYTES}"
    for round_ in range(3):
        for label in times:
            extra = {"tell_on": "^FATAL|listening on"} if label == "tell_on" else {}
            empty = run_to_end(server, state, files, 100 * round_ + 10 * len(times[label]) + 1, 0)
            times[label].append(run_to_end(server, state, files, 100 * round_ + 10 * len(times[label]) + 2,
                                           PUMP_BYTES, script=script, extra=extra) - empty)
    server.close()
    subprocess.run(SERVER + ["remove", "--state", state], check=True)
    without, with_tell = statistics.median(times["without"]), statistics.median(times["tell_on"])
    row("1 GiB of lines pumped, with tell_on (median of 3)", f"{PUMP_BYTES / with_tell / 1e6:.0f} MB/s",
        "target ≥ 0.8×", f"without, same run: {PUMP_BYTES / without / 1e6:.0f} MB/s ({without / with_tell:.2f}×)")

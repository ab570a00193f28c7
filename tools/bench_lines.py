"""tools/bench's `lines` group: waiting on a line, and a supervisor telling lines.

- From a matching line printed to `read` with `wait` and `pattern` returning
  (goal: a median of at most 10 ms), beside a `read` with `wait` alone
  returning for the same kind of line, in the same run.
- A supervisor's pump with a `tell_on` pattern against the same pump
  without one (goal: at least 0.8× its speed): a pattern with a literal, one
  without whose matches start lines, and one with neither (RE2 alone).
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
    pump_with_tell_on(files, row)


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
PUMP_ROUNDS = 5  # of each; the ratio is the median of each round's own (the load of two shared cores drifts)


def pump_with_tell_on(files: str, row: Callable[..., None]) -> None:
    """1 GiB of 64-byte lines pumped with a tell_on pattern (matching no line: the search alone is
    measured) against without, in interleaved rounds, through one serve with a stand-in way in (which
    the end messages reach); a pump's time is its command's start to its supervisor's exit, less that
    of an empty command."""
    scratch = os.path.dirname(files)
    state = tempfile.mkdtemp(prefix="state-", dir=scratch)
    keyring = tempfile.mkdtemp(prefix="keyring-", dir=scratch)
    with open(os.open(os.path.join(keyring, "bench.key"), os.O_WRONLY | os.O_CREAT, 0o600), "w") as key:
        key.write(os.urandom(16).hex())
    way_in = subprocess.Popen(SERVER + ["way-in", "--listen", "http://127.0.0.1:0/in", "--keyring", keyring],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert way_in.stderr is not None
    address = way_in.stderr.readline().split("listening on ", 1)[1].strip()
    server = Server(background_argv(files, state, output=str(2 * PUMP_BYTES),
                                    extra=("--way-in", address, "--as", "bench", "--keyring", keyring)))
    server.send(INIT)
    server.wait(0)
    patterns = {"without": None, "tell_on": "^FATAL|listening on [0-9]+", "no literal": "^[0-9]+ (ok|failed)$",
                "RE2 alone": "[0-9]+ [a-z]+$"}
    times: dict[str, list[float]] = {label: [] for label in patterns}
    script = f"yes '{'x' * 63}' | head -c {PUMP_BYTES}"
    request = 1
    labels = list(patterns)
    for turn in range(PUMP_ROUNDS):
        for label in labels[turn % len(labels):] + labels[:turn % len(labels)]:  # each goes first in turn
            pattern = patterns[label]
            extra = {"tell_on": pattern} if pattern else {}
            empty = run_to_end(server, state, files, request, 0, extra=extra)
            times[label].append(run_to_end(server, state, files, request + 1, PUMP_BYTES, script, extra) - empty)
            request += 2
    server.close()
    way_in.terminate()
    way_in.wait()
    subprocess.run(SERVER + ["remove", "--state", state], check=True)
    without = statistics.median(times["without"])
    for label, name in (("tell_on", f"1 GiB of lines pumped, tell_on {patterns['tell_on']!r}"),
                        ("no literal", f"  tell_on {patterns['no literal']!r} (a line's start)"),
                        ("RE2 alone", f"  tell_on {patterns['RE2 alone']!r} (no literal, no line's start)")):
        took = statistics.median(times[label])
        paired = statistics.median(bare / each for bare, each in zip(times["without"], times[label], strict=True))
        row(name, f"{PUMP_BYTES / took / 1e6:.0f} MB/s", "target ≥ 0.8×" if label == "tell_on" else "",
            f"without, same run: {PUMP_BYTES / without / 1e6:.0f} MB/s ({without / took:.2f}×; "
            f"round by round {paired:.2f}×)")

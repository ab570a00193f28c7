"""Link Run's benchmarks: the figures the issues name, measured in one run,
each beside a baseline measured in the same run.

    tools/bench                 # every group
    tools/bench foundation      # one group
    tools/bench --readme        # the groups of README's "how fast" table, and the table rewritten

Medians over repeated runs; memory from /proc (VmRSS, VmHWM); CPU from
/proc/<pid>/stat. Nothing here is a test: it prints figures, and a person
reads them against the issue's targets.
"""

from __future__ import annotations

import functools
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
SERVER = [sys.executable, "-I", "-m", "linkrun"]
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}
TICKS = os.sysconf("SC_CLK_TCK")


# The baseline: the least sandbox bwrap makes (every namespace, the host read-only).
# Calls of an agent come seconds apart; the bench leaves this much between
# any two things it times, so that a spare sandbox is made between calls, and
# no baseline is timed while one is being made.
PACE = 0.03
BARE_BWRAP = ["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "--new-session",
              "--dev", "/dev", "--proc", "/proc", "--"]


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class Server:
    """A server spoken to over pipes, its answers read by a thread."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None):
        self.started = time.perf_counter()
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, cwd=str(REPO), env=env)
        self.answers: dict = {}
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            message = orjson.loads(line)
            if "id" in message and "method" not in message:
                with self.cond:
                    self.answers[message["id"]] = (time.perf_counter(), message)
                    self.cond.notify_all()

    def send(self, message):
        self.process.stdin.write(orjson.dumps(message) + b"\n")
        self.process.stdin.flush()

    def wait(self, request_id, timeout=120.0):
        with self.cond:
            if not self.cond.wait_for(lambda: request_id in self.answers, timeout):
                raise TimeoutError(f"no answer to {request_id}")
            return self.answers.pop(request_id)

    def call(self, request_id, arguments):
        self.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                   "params": {"name": "command", "arguments": arguments}})

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=10)
        self.process.stdout.close()


def serve_argv(files: str, sandbox=("/usr/bin/env",)) -> list[str]:
    return SERVER + ["serve", "--files", files, "--programs-path", SYSTEM_PATH, "--timeout", "2m",
                     "--output", "16K", "--program", "*", "--"] + list(sandbox)


FIGURES: dict[str, tuple[str, str]] = {}  # README's "how fast" rows measured in this run: name -> (figure, baseline)


def figure(name: str, value: str, baseline: str) -> None:
    """A row of README's "how fast" table (`--readme` writes those measured)."""
    FIGURES[name] = (value, baseline)


def row(name: str, value: str, target: str = "", baseline: str = ""):
    print(f"  {name:<52} {value:>14}   {target:<22} {baseline}")


def foundation(files: str):
    print("foundation: serve and command (pass-through sandbox)")
    # Spawn → initialize answered, against a bare interpreter start in the same run.
    starts, bare, rss = [], [], []
    for _ in range(15):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-c", "pass"], check=True)
        bare.append(time.perf_counter() - t)
        server = Server(serve_argv(files))
        server.send(INIT)
        answered, _ = server.wait(0)
        starts.append(answered - server.started)
        rss.append(status_kb(server.process.pid, "VmRSS") / 1024)
        server.close()
    row("spawn → initialize answered (median)", f"{median_ms(starts):.1f} ms", "target ≤ 100 ms",
        f"bare `python -I -c pass`: {median_ms(bare):.1f} ms ({median_ms(starts) / median_ms(bare):.1f}×)")
    row("server RSS after initialize (median)", f"{statistics.median(rss):.1f} MB", "target ≤ 25 MB")

    # command of /bin/true against a direct fork/exec of the same argv.
    server = Server(serve_argv(files))
    server.send(INIT)
    server.wait(0)
    direct, through = [], []
    argv = ["/usr/bin/env", "--", "/bin/true"]
    for index in range(1, 301):
        t = time.perf_counter()
        subprocess.run(argv, check=True)
        direct.append(time.perf_counter() - t)
        t = time.perf_counter()
        server.call(index, {"program": "/bin/true"})
        server.wait(index)
        through.append(time.perf_counter() - t)
    overhead = median_ms(through) - median_ms(direct)
    row("command /bin/true (median)", f"{median_ms(through):.2f} ms", "target ≤ +1.5 ms",
        f"direct fork/exec: {median_ms(direct):.2f} ms (+{overhead:.2f} ms, {median_ms(through) / median_ms(direct):.2f}×)")

    # 20 × sleep 0.5 in flight at once.
    t = time.perf_counter()
    for index in range(1000, 1020):
        server.call(index, {"program": "sleep", "args": ["0.5"]})
    for index in range(1000, 1020):
        server.wait(index)
    row("20 × sleep 0.5 in flight: all answered", f"{time.perf_counter() - t:.3f} s", "target ≤ 0.55 s",
        "baseline: 0.5 s (one sleep)")

    # Idle CPU: nothing in flight for 2 s (after the last call's leftover kill, a second on).
    time.sleep(1.5)
    before = cpu_seconds(server.process.pid)
    time.sleep(2)
    row("idle CPU over 2 s", f"{cpu_seconds(server.process.pid) - before:.3f} s", "target 0")
    server.close()

    # 1 GiB floods, each on a fresh server so VmHWM is the flood's peak.
    for label, script in (
        ("one long line", "head -c 1073741824 /dev/zero"),
        ("2-byte lines", "yes | head -c 1073741824"),
    ):
        t = time.perf_counter()
        subprocess.run(["sh", "-c", f"{script} | cat > /dev/null"], check=True)
        baseline = time.perf_counter() - t
        server = Server(serve_argv(files))
        server.send(INIT)
        server.wait(0)
        t = time.perf_counter()
        server.call(1, {"program": "sh", "args": ["-c", script]})
        _, answer = server.wait(1)
        elapsed = time.perf_counter() - t
        peak = status_kb(server.process.pid, "VmHWM") / 1024
        structured = answer["result"]["structuredContent"]
        kept = "left out" in answer["result"]["content"][0]["text"]
        server.close()
        row(f"1 GiB on stdout, {label}", f"{elapsed:.3f} s", "target ≤ 1 s",
            f"the same read by cat: {baseline:.3f} s ({elapsed / baseline:.2f}×)")
        row("  server peak RSS; all bytes counted, cut shown", f"{peak:.1f} MB", "target ≤ 40 MB",
            f"bytes={structured['output_bytes']} cut={kept}")


def background_argv(files: str, state: str, output="16M", extra=("--no-way-in",)) -> list[str]:
    argv = serve_argv(files)[:-2]  # without "--" and the sandbox
    return argv + ["--state", state, *extra, "--background", "4", "--background-timeout", "1h",
                   "--background-output", output, "--background-keep", "1d", "--background-per-day", "100000",
                   "--hops", "4", "--", "/usr/bin/env"]


META = {"link.local/thread": "bench"}


def call(server: Server, request_id, name, arguments):
    server.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                 "params": {"name": name, "arguments": arguments, "_meta": META}})
    return server.wait(request_id)[1]["result"]


def wait_until(condition, timeout=30.0, pause=0.0005):
    deadline = time.perf_counter() + timeout
    while not condition():
        if time.perf_counter() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(pause)
    return time.perf_counter()


def load_record(state: str, command_id: str) -> dict | None:
    try:
        with open(os.path.join(state, command_id + ".json"), "rb") as f:
            return orjson.loads(f.read())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def starts_to_programs(server: Server, files: str, state: str, name: str,
                       times: int = 40) -> tuple[list[float], list[float], list[float]]:
    """`start` answered, then the program running after the answer, and the same program run directly."""
    answered, running, direct = [], [], []
    work = os.path.join(files, "work")
    for index in range(1, times + 1):
        marker = os.path.join(work, f"ran-{name}-{index}")
        t = time.perf_counter()
        subprocess.run(["sh", "-c", f": > {marker}.direct"], check=True)
        direct.append(time.perf_counter() - t)
        time.sleep(PACE)
        t = time.perf_counter()
        result = call(server, index, "start", {"program": "sh", "args": ["-c", f": > {marker}"]})
        answered.append(time.perf_counter() - t)
        done = wait_until(lambda marker=marker: os.path.exists(marker))
        running.append(done - t - answered[-1])
        wait_until(lambda r=result: (load_record(state, r["structuredContent"]["id"]) or {}).get("state") == "exited")
        time.sleep(PACE)
    return answered, running, direct


def up_starts_to_programs(files: str, how: str = "ahead") -> list[float]:
    """starts_to_programs through `up` (bubblewrap, the agent's cgroup and
    filter): the program running after each answer; the first starts, while the
    warm fork server imports, left out. `how`: "ahead" (each supervisor forked
    ahead makes its sandbox ahead), "at start" (the supervisor forked ahead,
    its sandbox made at its start), "booted" (each supervisor booted afresh)."""
    agent = os.path.join(os.path.dirname(files), "agent-background-" + how.replace(" ", "-"))
    knob = {"ahead": {}, "at start": {"LNK_SANDBOX_AHEAD": "0"}, "booted": {"LNK_WARM_FORKS": "0"}}[how]
    env = {**os.environ, **knob} if knob else None
    server = Server(SERVER + ["up", "--agent", agent, "--no-way-in"], env=env)
    server.send(INIT)
    server.wait(0)
    up_files, up_state = os.path.join(agent, "Files"), os.path.join(agent, "State")
    os.makedirs(os.path.join(up_files, "work"), exist_ok=True)
    starts_to_programs(server, up_files, up_state, "first", times=3)
    _, running, _ = starts_to_programs(server, up_files, up_state, "up")
    server.close()
    return running


def stops_and_rss(server: Server, state: str, times: int = 10) -> tuple[list[float], list[float]]:
    """`stop` until the program's group is gone; the supervisor's RSS, its stop file's watch set."""
    stops, rss = [], []
    for index in range(100, 100 + times):
        result = call(server, index, "start", {"program": "sleep", "args": ["100"]})
        command_id = result["structuredContent"]["id"]
        wait_until(lambda command_id=command_id: (load_record(state, command_id) or {}).get("state") == "running")
        record = load_record(state, command_id)
        gate = record["leader_pid"]
        with open(f"/proc/{gate}/stat") as f:
            supervisor = int(f.read().rsplit(")", 1)[1].split()[1])
        time.sleep(0.3)  # its watch's imports, booted or not
        rss.append(status_kb(supervisor, "VmRSS") / 1024)
        t = time.perf_counter()
        call(server, index + 1000, "stop", {"id": command_id})
        stops.append(wait_until(lambda gate=gate: gone(gate)) - t)
    return stops, rss


def warm_forks(serve: int) -> int | None:
    """serve's warm fork server, by its command line's word."""
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if parent == serve and b"warm-fork" in f.read().split(b"\0"):
                    return int(name)
        except (OSError, ValueError):
            continue
    return None


def background(files: str):
    print("background: start, stop, the supervisor, the output file, read")
    state = tempfile.mkdtemp(prefix="state-", dir=os.path.dirname(files))
    # Booted first: the warm serve that follows is the one the rows below use.
    booted = Server(background_argv(files, state), env={**os.environ, "LNK_WARM_FORKS": "0"})
    booted.send(INIT)
    booted.wait(0)
    _, booted_running, _ = starts_to_programs(booted, files, state, "booted")
    _, booted_rss = stops_and_rss(booted, state, times=4)
    booted.close()
    server = Server(background_argv(files, state))
    server.send(INIT)
    server.wait(0)
    wait_until(lambda: warm_forks(server.process.pid) is not None)
    time.sleep(0.2)  # its imports
    answered, running, direct = starts_to_programs(server, files, state, "warm")
    row("start answered (median)", f"{median_ms(answered):.1f} ms", "target ≤ 20 ms")
    row("  the program running, after the answer (median)", f"{median_ms(running):.1f} ms", "target ≤ 10 ms",
        f"booted: {median_ms(booted_running):.1f} ms; the program run directly: {median_ms(direct):.1f} ms")
    row("  the program running, after the answer (p99)", f"{p99_ms(running):.1f} ms", "",
        f"booted: {p99_ms(booted_running):.1f} ms")
    figure("a background program running after `start` answered (median)", f"{median_ms(running):.1f} ms",
           f"{median_ms(booted_running):.1f} ms with each supervisor booted afresh")
    real, at_start = up_starts_to_programs(files), up_starts_to_programs(files, "at start")
    real_booted = up_starts_to_programs(files, "booted")
    row("  the same through up's real sandbox (median)", f"{median_ms(real):.1f} ms", "target ≤ 10 ms",
        f"its sandbox made at its start: {median_ms(at_start):.1f} ms ({median_ms(real) / median_ms(at_start):.2f}×); "
        f"booted: {median_ms(real_booted):.1f} ms")
    row("  the same through up's real sandbox (p99)", f"{p99_ms(real):.1f} ms", "",
        f"made at its start: {p99_ms(at_start):.1f} ms; booted: {p99_ms(real_booted):.1f} ms")
    figure("a background program running after `start` answered, through up's sandbox (median)",
           f"{median_ms(real):.1f} ms ({median_ms(real) / median_ms(at_start):.2f}×)",
           f"{median_ms(at_start):.1f} ms with its sandbox made at its start; "
           f"{median_ms(real_booted):.1f} ms with each supervisor booted afresh")
    forks = warm_forks(server.process.pid)
    if forks is not None:
        row("the warm fork server's RSS", f"{status_kb(forks, 'VmRSS') / 1024:.1f} MB", "", "one per serve")

    stops, rss = stops_and_rss(server, state)
    row("stop → its group gone (median)", f"{median_ms(stops):.1f} ms", "target ≤ 100 ms")
    row("supervisor RSS while it runs (median)", f"{statistics.median(rss):.1f} MB", "target ≤ 20 MB",
        f"booted: {statistics.median(booted_rss):.1f} MB")

    server.close()
    pump(files)
    if os.path.isdir("/dev/shm"):
        with tempfile.TemporaryDirectory(prefix="linkrun-bench-", dir="/dev/shm") as memory:
            os.makedirs(os.path.join(memory, "files", "work"))
            pump(os.path.join(memory, "files"), "  in tmpfs, ")

    # read: 64 KiB at random offsets of a 16 MiB output.
    argv = background_argv(files, state)
    argv[argv.index("--output") + 1] = "64K"
    server = Server(argv)
    server.send(INIT)
    server.wait(0)
    result = call(server, 1, "start", {"program": "sh", "args": ["-c", "base64 -w 100 /dev/urandom | head -c 16777216"]})
    command_id = result["structuredContent"]["id"]
    wait_until(lambda: (load_record(state, command_id) or {}).get("state") == "exited")
    import random

    reads, pings = [], []
    for index in range(2, 202):
        offset = random.randrange(0, 16 * 1024 * 1024 - 65536)
        t = time.perf_counter()
        server.send({"jsonrpc": "2.0", "id": index, "method": "ping"})
        server.wait(index)
        pings.append(time.perf_counter() - t)
        t = time.perf_counter()
        call(server, index + 1000, "read", {"id": command_id, "offset": offset})
        reads.append(time.perf_counter() - t)
    row("read of 64 KiB at a random offset of 16 MiB", f"{median_ms(reads):.2f} ms", "target ≤ 2 ms",
        f"a ping round trip: {median_ms(pings):.2f} ms")
    server.close()
    subprocess.run(SERVER + ["remove", "--state", state], check=True)


PUMP_BYTES = 1 << 30
KEPT = 16 << 20  # the default --background-output: the file rotates at twice it


def pump(files: str, where: str = "") -> None:
    """The pump's MB/s against its floor on the same disk, interleaved over
    rounds: plain writing while under the cap (`head -c > file`), and with
    rotation the same bytes plus the copies each rotation makes. The pump's
    time is a command's start-to-end less that of an empty one, so the
    supervisor's own start is not counted."""
    scratch = os.path.dirname(files)
    servers = {}
    for label, kept in (("plain", 2 * PUMP_BYTES), ("rotating", KEPT)):
        state = tempfile.mkdtemp(prefix="state-", dir=scratch)
        server = Server(background_argv(files, state, output=str(kept)))
        server.send(INIT)
        server.wait(0)
        servers[label] = (server, state)
    floors = {"plain": lambda: write_floor(files, PUMP_BYTES), "rotating": lambda: rotation_floor(files, PUMP_BYTES, KEPT)}
    times: dict[str, list[float]] = {"plain": [], "rotating": []}
    floor_times: dict[str, list[float]] = {"plain": [], "rotating": []}
    piped: list[float] = []  # the same bytes through a pipe and a second process, no Link Run: as the pump moves them
    for round_ in range(3):
        piped.append(write_floor(files, PUMP_BYTES, through_cat=True))
        for label, (server, state) in servers.items():
            floor_times[label].append(floors[label]())
            empty = run_to_end(server, state, files, 10 * round_ + 1, 0)
            times[label].append(run_to_end(server, state, files, 10 * round_ + 2, PUMP_BYTES) - empty)
    for server, state in servers.values():
        server.close()
        subprocess.run(SERVER + ["remove", "--state", state], check=True)
    mib = PUMP_BYTES / 2**20
    for label, name, floor_name in (
        ("plain", f"{mib:.0f} MiB pumped, under its cap", "`head -c > file`"),
        ("rotating", f"{mib:.0f} MiB pumped, rotating at 2 × {KEPT >> 20} MiB",
         f"the same written and freed, plus {rotations(PUMP_BYTES, KEPT)} copies of {KEPT >> 20} MiB"),
    ):
        seconds, floor = statistics.median(times[label]), statistics.median(floor_times[label])
        rate, floor_rate = PUMP_BYTES / seconds / 1e6, PUMP_BYTES / floor / 1e6
        row(f"{where}{name}", f"{rate:.0f} MB/s", "target ≥ 0.8× floor",
            f"floor, {floor_name}: {floor_rate:.0f} MB/s ({floor / seconds:.2f}×)"
            + (f"; `head | cat > file`: {PUMP_BYTES / statistics.median(piped) / 1e6:.0f} MB/s "
               f"({floor / statistics.median(piped):.2f}×)" if label == "plain" else ""))
        if not where:
            figure(f"a background command's output, {name[len(f'{mib:.0f} MiB pumped, '):]}",
                   f"{rate:.0f} MB/s ({floor / seconds:.2f}×)", f"{floor_name}: {floor_rate:.0f} MB/s")


def run_to_end(server: Server, state: str, files: str, request_id: int, size: int, script: str | None = None,
               extra: dict | None = None) -> float:
    """Seconds from `start` of `head -c size /dev/zero` to its supervisor's
    exit; its output file is removed after, so that no round's writeback
    falls on the next.

    The supervisor's exit is waited for on a pidfd: polling the record while
    the pump runs would wake the supervisor's watch of the state folder at
    each look, and slow what is measured."""
    t = time.perf_counter()
    arguments = {"program": "head", "args": ["-c", str(size), "/dev/zero"]} if script is None or not size else \
        {"program": "sh", "args": ["-c", script]}
    result = call(server, request_id, "start", {**arguments, **(extra or {})})
    command_id = result["structuredContent"]["id"]
    wait_until(lambda: "leader_pid" in (load_record(state, command_id) or {}), pause=0.002)
    try:
        with open(f"/proc/{load_record(state, command_id)['leader_pid']}/stat") as f:
            supervisor = os.pidfd_open(int(f.read().rsplit(")", 1)[1].split()[1]))
    except (FileNotFoundError, ProcessLookupError):
        supervisor = None  # the gate, or the supervisor, is gone already
    if supervisor is not None:
        select.select([supervisor], [], [], 300)
        os.close(supervisor)
    wait_until(lambda: (load_record(state, command_id) or {}).get("state") == "exited", pause=0.002)
    elapsed = time.perf_counter() - t
    os.unlink(os.path.join(files, "background", command_id + ".out"))
    return elapsed


def rotations(size: int, kept: int) -> int:
    """How many times a file rotating at twice `kept` is cut while `size` bytes go in."""
    return max(0, size // kept - 1)


def write_floor(files: str, size: int, through_cat: bool = False) -> float:
    path = os.path.join(files, "work", "floor.out")
    write = 'head -c "$1" /dev/zero | cat > "$2"' if through_cat else 'head -c "$1" /dev/zero > "$2"'
    t = time.perf_counter()
    subprocess.run(["sh", "-c", write, "sh", str(size), path], check=True)
    elapsed = time.perf_counter() - t
    os.unlink(path)
    return elapsed


def rotation_floor(files: str, size: int, kept: int) -> float:
    """The bytes written then freed, and each rotation's copy of the kept
    half into a new file, the one before it freed (no rename over a file,
    which ext4 follows with a write to disk)."""
    work = os.path.join(files, "work")
    source = os.path.join(work, "floor.full")
    copies = (os.path.join(work, "floor.kept.0"), os.path.join(work, "floor.kept.1"))
    subprocess.run(["sh", "-c", 'head -c "$1" /dev/zero > "$2"', "sh", str(2 * kept), source], check=True)
    source_fd = os.open(source, os.O_RDONLY)
    t = time.perf_counter()
    subprocess.run(["sh", "-c", 'head -c "$1" /dev/zero > "$2" && rm "$2"', "sh", str(size),
                    os.path.join(work, "floor.out")], check=True)
    for index in range(rotations(size, kept)):
        fd = os.open(copies[index % 2], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        copied = 0
        while copied < kept:
            copied += os.copy_file_range(source_fd, fd, kept - copied, kept + copied)
        os.close(fd)
        if index:
            os.unlink(copies[1 - index % 2])
    elapsed = time.perf_counter() - t
    os.close(source_fd)
    for path in (source, *copies):
        if os.path.exists(path):
            os.unlink(path)
    return elapsed


def told(files: str):
    print("told: the way in, sweeps, stop --state")
    scratch = os.path.dirname(files)
    keyring = tempfile.mkdtemp(prefix="keyring-", dir=scratch)
    key = os.path.join(keyring, "bench.key")
    with open(key, "w") as f:
        f.write(os.urandom(16).hex())
    os.chmod(key, 0o600)
    listener = subprocess.Popen(SERVER + ["way-in", "--listen", "http://127.0.0.1:0/in", "--keyring", keyring],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    address = listener.stderr.readline().decode().split("listening on ", 1)[1].strip()
    state = tempfile.mkdtemp(prefix="state-", dir=scratch)
    server = Server(background_argv(files, state, extra=("--way-in", address, "--as", "bench", "--keyring", keyring)))
    server.send(INIT)
    server.wait(0)
    delays = []
    for index in range(1, 11):
        call(server, index, "start", {"program": "true"})
        message = orjson.loads(listener.stdout.readline())
        arrived = time.time()
        record = load_record(state, message["id"])
        delays.append(arrived - record["ended"])
    row("told after the end (median)", f"{median_ms(delays):.1f} ms", "target ≤ 50 ms")

    # stop --state with 4 running.
    for index in range(20, 24):
        call(server, index, "start", {"program": "sleep", "args": ["100"]})
    t = time.perf_counter()
    subprocess.run(SERVER + ["stop", "--state", state], check=True, stderr=subprocess.DEVNULL)
    row("stop --state with 4 running: all ended", f"{(time.perf_counter() - t) * 1000:.0f} ms", "target ≤ 500 ms",
        "including one interpreter start")
    server.close()
    listener.terminate()
    listener.wait()

    # 1,000 ended records: a sweep of them, and serve's start beside them.
    big = tempfile.mkdtemp(prefix="state-", dir=scratch)
    sys.path.insert(0, str(REPO))
    from linkrun.state import records

    for _ in range(1000):
        command_id = records.new_id()
        os.close(records.create_lock(big, command_id))
        records.write(big, command_id, {"v": 1, "id": command_id, "files": files, "state": "exited", "exit": 0,
                                        "signal": None, "told": "told", "started": time.time() - 10,
                                        "ended": time.time() - 5, "keep": 86400, "thread": "bench"})
    sweeps = []
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run(SERVER + ["sweep", big], check=True)
        sweeps.append(time.perf_counter() - t)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-I", "-c", "pass"], check=True)
    bare = time.perf_counter() - t
    row("sweep of 1,000 ended records (median)", f"{median_ms(sweeps):.0f} ms", "target ≤ 1,000 ms",
        f"an interpreter start: {bare * 1000:.0f} ms")
    starts = []
    for _ in range(10):
        server = Server(background_argv(files, big))
        server.send(INIT)
        answered, _ = server.wait(0)
        starts.append(answered - server.started)
        server.close()
    row("spawn → initialize with 1,000 records", f"{median_ms(starts):.1f} ms", "target ≤ 100 ms")
    for folder in (state, big):
        subprocess.run(SERVER + ["remove", "--state", folder], check=True)


def up_starts(argv: list[str], times: int = 10) -> tuple[float, Server]:
    """The median ms from spawning `up` to its initialize answered, and the last server, still up."""
    samples = []
    for index in range(times):
        t = time.perf_counter()
        server = Server(argv)
        server.send(INIT)
        answered, _ = server.wait(0)
        samples.append(answered - t)
        if index < times - 1:
            server.close()
    return median_ms(samples), server


def sandbox(files: str):
    print("sandbox: up and the bubblewrap sandbox")
    scratch = os.path.dirname(files)
    agent = os.path.join(scratch, "agent")
    started, server = up_starts(SERVER + ["up", "--agent", agent])
    server.close()
    row("up (embedded defaults) → initialize answered", f"{started:.1f} ms", "target ≤ 150 ms")

    # A call of /bin/true through up's sandbox, against a bare run of the same bwrap argv.
    bare_argv, filter_path = direct_plan(agent, ["/bin/true"])

    def run_bare(command: list[str]):
        run_direct(command, filter_path, env={})

    minimal = BARE_BWRAP + ["/bin/true"]
    unhardened = _without_hardening(bare_argv)
    server = Server(SERVER + ["up", "--agent", agent])
    server.send(INIT)
    server.wait(0)
    bare, through, least, soft = [], [], [], []
    sh_argv = bare_argv[:-1] + ["/usr/bin/sh", "-c", "exit 0"]
    t_sh, echo, plain, cold = [], [], [], []
    # A script over spare.SCRIPT_LIMIT: the call sets up a sandbox of its own, as with no spare.
    padding = "#" * 9000

    def up_call(request_id: int, args: list[str]) -> None:
        server.call(request_id, {"program": "sh", "args": args})
        server.wait(request_id)

    for index in range(1, 101):
        for samples, run in ((bare, lambda: run_bare(bare_argv)),
                             (soft, lambda: subprocess.run(unhardened, check=True, env={})),
                             (through, lambda i=index: up_call(i, ["-c", "exit 0"])),
                             (echo, lambda i=index: up_call(1000 + i, ["-c", "echo hi"])),
                             (cold, lambda i=index: up_call(2000 + i, ["-c", "echo hi", padding])),
                             (t_sh, lambda: run_bare(sh_argv)),
                             (least, lambda: subprocess.run(minimal, check=True, env={})),
                             # the peers' way: most agents run a command in a shell of their own, unsandboxed
                             (plain, lambda: subprocess.run(["sh", "-c", "echo hi"], check=True, env={},
                                                            stdout=subprocess.DEVNULL))):
            time.sleep(PACE)  # an agent's pace, calls apart: what one call leaves to do is done before the next
            t = time.perf_counter()
            run()
            samples.append(time.perf_counter() - t)
    row("command `sh -c 'exit 0'` through up's sandbox", f"{median_ms(through):.2f} ms", "target ≤ +2 ms",
        f"bare bwrap of the same argv: {median_ms(t_sh):.2f} ms ({median_ms(through) - median_ms(t_sh):+.2f} ms); "
        f"/bin/true bare: {median_ms(bare):.2f} ms")
    row("  the same, against a minimal bwrap of /bin/true", f"{median_ms(through) / median_ms(least):.2f}×", "",
        f"minimal bwrap (--ro-bind / / --unshare-all --dev --proc): {median_ms(least):.2f} ms; "
        f"the fixed argv's /bin/true: {median_ms(bare) / median_ms(least):.2f}×")
    row("command `sh -c 'echo hi'` through up, against the minimal bwrap", f"{median_ms(echo) / median_ms(least):.2f}×",
        "target ≤ 1.4×", f"echo hi: {median_ms(echo):.2f} ms; minimal bwrap: {median_ms(least):.2f} ms")
    row("  the same, a call that sets up its own sandbox (no spare)", f"{median_ms(cold) / median_ms(least):.2f}×", "",
        f"echo hi, its script over 8 KiB: {median_ms(cold):.2f} ms")
    figure("`echo hi` through up, a call that sets up its own sandbox (no spare)",
           f"{median_ms(cold):.2f} ms ({median_ms(cold) / median_ms(least):.2f}×)",
           f"a minimal bwrap of /bin/true: {median_ms(least):.2f} ms")
    figure("`echo hi` through up, a whole MCP call", f"{median_ms(echo):.2f} ms ({median_ms(echo) / median_ms(least):.2f}×)",
           f"a minimal bwrap of /bin/true: {median_ms(least):.2f} ms")
    row("  the same, against the peers' way: a shell's own spawn, no sandbox", f"+{median_ms(echo) - median_ms(plain):.2f} ms",
        "", f"`sh -c 'echo hi'` spawned directly: {median_ms(plain):.2f} ms")
    figure("`echo hi` through up, against the peers' way (the agent's own shell, no sandbox)",
           f"{median_ms(echo):.2f} ms (+{median_ms(echo) - median_ms(plain):.2f} ms)",
           f"`sh -c 'echo hi'` spawned directly: {median_ms(plain):.2f} ms")
    row("  /bin/true: the fixed argv against it without v4's hardening", f"{median_ms(bare) / median_ms(soft):.2f}×",
        "", f"with: {median_ms(bare):.2f} ms; without /proc's read-only binds, /dev read-only and the filter: "
        f"{median_ms(soft):.2f} ms")
    pid = server.process.pid
    row("serve's memory after those 200 calls", f"{status_kb(pid, 'VmRSS') / 1024:.1f} MiB", "",
        f"its threads: {len(os.listdir(f'/proc/{pid}/task'))}")
    server.close()
    limits_cost(files)


def direct_plan(agent: str, program: list[str]) -> tuple[list[str], str | None]:
    """up's sandbox for `program` as bwrap's own argv, to run without serve:
    what `sandbox --print` gives, its descriptors bound by path (each call
    opens its filter afresh: `run_direct`); and the agent's filter, if it has one."""
    import shlex

    plan = subprocess.run(SERVER + ["sandbox", "--agent", agent, "--print", "--", *program],
                          capture_output=True, text=True, check=True).stdout
    argv = shlex.split(plan.strip().splitlines()[-1])
    # serve runs bwrap itself and sets prlimit's limits on the sandbox's init: no prlimit exec, as here.
    bare_argv = argv[argv.index("--") + 1:] if os.path.basename(argv[0]) == "prlimit" else list(argv)
    # The printed argv binds work/ by a descriptor of the printing process: bind it by path here.
    while "--bind-fd" in bare_argv:
        index = bare_argv.index("--bind-fd")
        bare_argv[index:index + 3] = ["--bind", bare_argv[index + 2], bare_argv[index + 2]]
    # And the /etc view by a descriptor: bind the view's link by path (bwrap follows it).
    if "--ro-bind-fd" in bare_argv:
        index = bare_argv.index("--ro-bind-fd")
        bare_argv[index:index + 2] = ["--ro-bind", os.path.join(agent, "State", "etc.view")]
    filter_path = os.path.join(agent, "State", "seccomp.bpf")
    return bare_argv, filter_path if "--seccomp" in bare_argv else None


def run_direct(argv: list[str], filter_path: str | None, **run: Any) -> subprocess.CompletedProcess[bytes]:
    """A `direct_plan` argv run, its filter opened for it, as a call does."""
    if filter_path is None:
        return subprocess.run(argv, check=True, **run)
    at = argv.index("--seccomp") + 1
    fd = os.open(filter_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return subprocess.run(argv[:at] + [str(fd)] + argv[at + 1:], check=True, pass_fds=(fd,), **run)
    finally:
        os.close(fd)


def _without_hardening(argv: list[str]) -> list[str]:
    """The fixed argv as it was before v4: /proc and /dev writable, no filter."""
    kept, index = [], 0
    while index < len(argv):
        if argv[index] == "--ro-bind" and argv[index + 1].startswith("/proc/"):
            index += 3
        elif argv[index] == "--seccomp" or argv[index:index + 2] in (["--remount-ro", "/dev"], ["--remount-ro", "/proc"]):
            index += 2
        else:
            kept.append(argv[index])
            index += 1
    return kept


def limits_cost(files: str):
    """What joining a cgroup costs a call: the same call through serve with
    --limits and without, interleaved in one run (a pass-through sandbox, so
    that the difference is the group alone: made, joined by the small sh,
    removed)."""
    from linkrun.sandboxing import cgroups

    place = cgroups.find()
    if not place.folders:
        row("a call joining its cgroup", "not run", "", f"no cgroup here: {'; '.join(place.missing.values())}")
        return
    plain_argv = serve_argv(files)
    limited_argv = plain_argv[:-2] + ["--limits", "memory=1G,tasks=256,cpu=100%"] + plain_argv[-2:]
    servers = [Server(plain_argv), Server(limited_argv)]
    for server in servers:
        server.send(INIT)
        server.wait(0)
    samples: list[list[float]] = [[], []]
    for index in range(1, 201):
        for server, times in zip(servers, samples, strict=True):
            t = time.perf_counter()
            server.call(index, {"program": "true"})
            server.wait(index)
            times.append(time.perf_counter() - t)
    plain, limited = (median_ms(times) for times in samples)
    row(f"a call joining its cgroup (v{place.version}: {', '.join(place.folders)})",
        f"+{limited - plain:.2f} ms", "target well under 1 ms",
        f"`true` with limits: {limited:.2f} ms; without: {plain:.2f} ms")
    figure("a call's cgroup (memory, tasks, CPU limits)", f"+{limited - plain:.2f} ms", f"the same call without: {plain:.2f} ms")
    for server in servers:
        server.close()


def proxy_group(files: str):
    print("proxy: the agent's internet proxy, on loopback")
    import fcntl
    import socket
    import threading

    size = 512 * 1024 * 1024
    payload = b"x" * (1 << 20)
    listener = socket.create_server(("127.0.0.2", 0), backlog=128)
    port = listener.getsockname()[1]

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            def send(conn=conn):
                with conn:
                    wanted = conn.recv(16)
                    if wanted.startswith(b"BIG"):
                        for _ in range(size // len(payload)):
                            conn.sendall(payload)
                    else:
                        conn.sendall(b"ok")
            threading.Thread(target=send, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    state = tempfile.mkdtemp(prefix="state-", dir=os.path.dirname(files))
    users = os.open(os.path.join(state, "proxy.users"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(users, fcntl.LOCK_SH)
    sys.path.insert(0, str(REPO))
    from linkrun.network import internet

    internet.write_settings(state, [f"127.0.0.2:{port}"], None)
    process = subprocess.Popen(SERVER + ["proxy", "--state", state], stderr=subprocess.DEVNULL)
    path = os.path.join(state, "proxy", "proxy.sock")

    def through() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(path)
        sock.sendall(f"CONNECT 127.0.0.2:{port} HTTP/1.1\r\n\r\n".encode())
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += sock.recv(4096)
        return sock

    wait_until(lambda: os.path.exists(path))
    time.sleep(0.2)

    def fetch(connect, big: bool) -> int:
        sock = connect()
        sock.sendall(b"BIG" if big else b"small")
        total = 0
        buffer = bytearray(1 << 20)
        while count := sock.recv_into(buffer):
            total += count
        sock.close()
        return total

    def direct() -> socket.socket:
        return socket.create_connection(("127.0.0.2", port))

    for label, connect in (("direct", direct), ("proxy", through)):
        t = time.perf_counter()
        fetch(connect, True)
        elapsed = time.perf_counter() - t
        if label == "direct":
            direct_rate = size / elapsed / 1e6
        else:
            rate = size / elapsed / 1e6
    row("throughput through the proxy (512 MiB)", f"{rate:.0f} MB/s", "target ≥ 200 MB/s",
        f"direct loopback: {direct_rate:.0f} MB/s ({rate / direct_rate:.2f}×)")
    lat_direct, lat_proxy = [], []
    for _ in range(100):
        t = time.perf_counter()
        fetch(direct, False)
        lat_direct.append(time.perf_counter() - t)
        t = time.perf_counter()
        fetch(through, False)
        lat_proxy.append(time.perf_counter() - t)
    row("a connection and a small answer through the proxy", f"{median_ms(lat_proxy):.2f} ms", "target ≤ +2 ms",
        f"direct: {median_ms(lat_direct):.2f} ms (+{median_ms(lat_proxy) - median_ms(lat_direct):.2f} ms)")
    os.close(users)
    process.wait(timeout=10)
    internet_cost(files, port)
    listener.close()


def internet_cost(files: str, port: int):
    """What a call pays for the internet: `sh -c 'exit 0'` through up's
    sandbox with an [internet] host named (the proxy handed the sandbox,
    and listening inside, before the program runs) against the same call without one, the two servers' calls interleaved
    so that the machine's drift falls on both."""
    scratch = os.path.dirname(files)
    servers, starts, samples = {}, {}, {"none": [], "internet": []}
    for label, text in (("none", ""), ("internet", f'[internet]\nhosts = ["127.0.0.2:{port}"]\n')):
        agent = os.path.join(scratch, f"agent-{label}")
        sandbox_file = os.path.join(scratch, f"sandbox-{label}.toml")
        Path(sandbox_file).write_text(text)
        starts[label], server = up_starts(SERVER + ["up", "--agent", agent, "--sandbox", sandbox_file])
        servers[label] = server
        server.call(1, {"program": "sh", "args": ["-c", "exit 0"]})  # the first starts the proxy
        server.wait(1)
    from linkrun.network import internet

    proxy = internet._answers(internet.socket_path(os.path.join(scratch, "agent-internet", "State")))
    hands = proxy_child(proxy)
    cpu_before = proxy_cpu(proxy, hands)
    calls = 200
    for index in range(2, 2 + calls):
        for label, server in servers.items():
            time.sleep(PACE)  # an agent's pace: each server's spare sandbox is made before the next call
            t = time.perf_counter()
            server.call(index, {"program": "sh", "args": ["-c", "exit 0"]})
            server.wait(index)
            samples[label].append(time.perf_counter() - t)
    cpu = [(after - before) * 1000 / calls for after, before in zip(proxy_cpu(proxy, hands), cpu_before, strict=True)]
    for server in servers.values():
        server.close()
    with_hosts, without = median_ms(samples["internet"]), median_ms(samples["none"])
    row("up with [internet] hosts → initialize answered", f"{starts['internet']:.1f} ms", "",
        f"without: {starts['none']:.1f} ms ({starts['internet'] / starts['none']:.2f}×)")
    row("a call with [internet] hosts (the handed listener)", f"{with_hosts:.2f} ms", "target ≤ +1 ms",
        f"without: {without:.2f} ms (+{with_hosts - without:.2f} ms, {with_hosts / without:.2f}×)")
    figure("a call with `[internet]` hosts", f"+{with_hosts - without:.2f} ms", f"the same call without: {without:.2f} ms")
    row(f"the proxy's CPU per call ({'by spares' if cpu[2] else 'in place'})", f"{sum(cpu):.2f} ms",
        "", f"proxy {cpu[0]:.2f}, hand-over {cpu[1]:.2f}, its spares {cpu[2]:.2f} ms")


def proxy_child(proxy: int) -> int:
    """The proxy's hand-over process (its one child)."""
    with open(f"/proc/{proxy}/task/{proxy}/children") as f:
        return int(f.read().split()[0])


def proxy_cpu(proxy: int, hands: int) -> tuple[float, float, float]:
    """CPU seconds of the proxy, its hand-over process, and the spares that process reaped."""
    with open(f"/proc/{hands}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return cpu_seconds(proxy), cpu_seconds(hands), (int(fields[13]) + int(fields[14])) / TICKS


def faults(files: str):
    print("faults: waiting costs nothing, nothing piles up, told soon after an outage")
    scratch = os.path.dirname(files)
    state = tempfile.mkdtemp(prefix="state-", dir=scratch)
    server = Server(background_argv(files, state))
    server.send(INIT)
    server.wait(0)
    pid = server.process.pid
    # CPU while a read waits 5 s on a silent command, against serve idle for 5 s (the first wait
    # loads watchdog: a short read first).
    command_id = call(server, 1, "start", {"program": "sleep", "args": ["30"]})["structuredContent"]["id"]
    call(server, 2, "read", {"id": command_id, "wait": 0.2})
    before = cpu_seconds(pid)
    time.sleep(5)
    idle = cpu_seconds(pid) - before
    before = cpu_seconds(pid)
    call(server, 3, "read", {"id": command_id, "offset": 0, "wait": 5})
    waiting = cpu_seconds(pid) - before
    row("serve's CPU while a read waits 5 s", f"{waiting:.2f} s", "target < 0.05 s", f"serve idle for 5 s: {idle:.2f} s")
    call(server, 4, "stop", {"id": command_id})

    # Descriptors and threads before and after 1,000 chatty calls (each fills its head, then goes on).
    def counts() -> tuple[int, int]:
        return len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))

    fds_before, threads_before = counts()
    for index in range(10, 1010):
        server.call(index, {"program": "sh", "args": ["-c", "head -c 20000 /dev/zero; seq 1 2000"]})
        server.wait(index)
    _, threads_right_after = counts()
    time.sleep(1.5)  # each call's leftovers are killed a second after it (a timer thread each, till then)
    fds_after, threads_after = counts()
    row("serve's descriptors, before → after 1,000 chatty calls", f"{fds_before} → {fds_after}", "no growth")
    row("serve's threads, before → 1.5 s after", f"{threads_before} → {threads_after}", "no growth",
        f"right after the last answer: {threads_right_after} (the leftover timers)")
    server.close()

    # Told after an outage: the way in down when the command ends (its supervisor backs off),
    # back on the same address, then a sweep as a bridge runs it at its start.
    keyring = tempfile.mkdtemp(prefix="keyring-", dir=scratch)
    with open(os.path.join(keyring, "bench.key"), "w") as f:
        f.write(os.urandom(16).hex())
    os.chmod(os.path.join(keyring, "bench.key"), 0o600)
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"http://127.0.0.1:{port}/in"
    state = tempfile.mkdtemp(prefix="state-", dir=scratch)
    server = Server(background_argv(files, state, extra=("--way-in", address, "--as", "bench", "--keyring", keyring)))
    server.send(INIT)
    server.wait(0)
    command_id = call(server, 1, "start", {"program": "true"})["structuredContent"]["id"]
    wait_until(lambda: (load_record(state, command_id) or {}).get("first_try") is not None)
    listener = subprocess.Popen(SERVER + ["way-in", "--listen", address, "--keyring", keyring],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    listener.stderr.readline()  # listening
    t = time.perf_counter()
    subprocess.run(SERVER + ["sweep", state], check=True, stderr=subprocess.DEVNULL)
    swept = time.perf_counter()
    listener.stdout.readline()
    told_at = time.perf_counter()
    row("told after the way in is back, from the sweep's end", f"{(told_at - swept) * 1000:.0f} ms", "target ≤ 1 s",
        f"the sweep itself: {(swept - t) * 1000:.0f} ms")
    server.close()
    listener.terminate()
    listener.wait()
    subprocess.run(SERVER + ["remove", "--state", state], check=True, stderr=subprocess.DEVNULL)


AGENT_COUNTS = (1, 2, 4, 8)
CALLS_EACH = 40  # per client and round
ECHO = {"program": "sh", "args": ["-c", "echo hi"]}
_together = None  # the pool's barrier: every client starts its loop at once


def _join_pool(barrier: Any) -> None:  # a multiprocess Barrier
    global _together
    _together = barrier


def up_client(folder: str) -> list[float]:
    """One agent: its own `up` in its own folder, then calls of `echo hi` in a
    loop: when each ended (time.monotonic), and how long it took, in turn."""
    server = Server(SERVER + ["up", "--agent", folder])
    server.send(INIT)
    server.wait(0)
    server.call(1, ECHO)  # the first call pays for what is loaded once
    server.wait(1)
    _together.wait()
    timed = []
    for request_id in range(2, 2 + CALLS_EACH):
        t = time.perf_counter()
        server.call(request_id, ECHO)
        answer = server.wait(request_id)[1]
        timed += [time.monotonic(), time.perf_counter() - t]
        if answer["result"].get("isError"):
            raise RuntimeError(f"a call through up failed: {answer['result']}")
    server.close()
    return timed


def bare_client(folder: str) -> list[float]:
    """The same loop, each call a bare bwrap of `sh -c 'echo hi'`, its output read."""
    argv = [*BARE_BWRAP, "sh", *ECHO["args"]]
    _together.wait()
    timed = []
    for _ in range(CALLS_EACH):
        t = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.PIPE, env={"PATH": SYSTEM_PATH})
        timed += [time.monotonic(), time.perf_counter() - t]
    return timed


def direct_client(plan: tuple[list[str], str | None, bytes | None], folder: str) -> list[float]:
    """The same loop, each call up's sandbox spawned directly (`direct_plan`),
    no serve: its program `sh -c 'echo hi'`, or its loader given the script
    of it (spare.py) when the plan has one."""
    argv, filter_path, script = plan
    _together.wait()
    timed = []
    for _ in range(CALLS_EACH):
        t = time.perf_counter()
        run_direct(argv, filter_path, input=script, stdout=subprocess.PIPE, env={"PATH": SYSTEM_PATH})
        timed += [time.monotonic(), time.perf_counter() - t]
    return timed


def busy_seconds() -> float:
    """The CPU time of the whole machine so far, all cores, idle and waiting
    for the disk left out, and this process's own (the bench's sampling) too."""
    with open("/proc/stat") as f:
        ticks = [int(field) for field in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICKS - time.process_time()


def memory_map_of(pid: int) -> tuple[str, ...]:
    """Where a process's code and stack start and end: the same as its
    parent's while it is a fork not yet exec'd, which shares (vfork) or
    copies the parent's memory and must not be counted twice."""
    with open(f"/proc/{pid}/stat") as f:
        return tuple(f.read().rsplit(")", 1)[1].split()[23:26])


def descendants_rss_mb(pid: int, depth: int = 0, below: int = 2) -> float:
    """The RSS of a process tree's members at least `below` levels under `pid` (in MB)."""
    total = 0.0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        own_map = memory_map_of(pid)
    except FileNotFoundError:
        return 0.0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children = [int(child) for child in f.read().split()]
        except FileNotFoundError:
            continue
        for child in children:
            try:
                if depth + 1 >= below and memory_map_of(child) != own_map:  # the same: not exec'd yet
                    total += status_kb(child, "VmRSS") / 1024
            except FileNotFoundError:
                continue
            total += descendants_rss_mb(child, depth + 1, below)
    return total


def run_clients(client: Callable[[str], list[float]], folders: list[str]) -> tuple[list[float], float, float]:
    """Every folder's client at once, each in a worker process of a pool: the
    calls' seconds, the peak RSS of what the workers run (servers,
    sandboxes, bwraps; the workers themselves left out), and the machine's
    CPU a call while every client was calling (from the first call's end
    to the first client's last: no start-up, no client alone)."""
    import multiprocess

    barrier = multiprocess.Barrier(len(folders))
    with multiprocess.Pool(len(folders), initializer=_join_pool, initargs=(barrier,)) as pool:
        pending = pool.map_async(client, folders)
        peak, busy = 0.0, [(time.monotonic(), busy_seconds())]
        while not pending.ready():
            try:
                peak = max(peak, descendants_rss_mb(os.getpid()))
            except (OSError, ValueError):
                pass  # a process ended while it was read
            pending.wait(0.02)
            busy.append((time.monotonic(), busy_seconds()))
        results = pending.get()
    ends = [timed[0::2] for timed in results]
    start, end = min(each[0] for each in ends), min(each[-1] for each in ends)
    calls = sum(start < at <= end for each in ends for at in each)

    def busy_at(when: float) -> float:  # between the two samples around it
        later = next(at for at, (moment, _) in enumerate(busy) if moment >= when)
        (t0, b0), (t1, b1) = busy[max(0, later - 1)], busy[later]
        return b0 + (b1 - b0) * (when - t0) / (t1 - t0) if t1 > t0 else b1

    return [seconds for timed in results for seconds in timed[1::2]], peak, (busy_at(end) - busy_at(start)) / calls


def p99_ms(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98] * 1000


def agents(files: str) -> None:
    print("agents: N agents at once, each its own up, each client calling `echo hi` in a loop")
    scratch = os.path.dirname(files)
    sleeps_at_once(files)
    # CPU a call: the whole machine's, while every client calls (the kernel's
    # own threads included: a sandbox's teardown runs there). Once the cores
    # are busy, each of N calls at once takes about N times it over the cores:
    # the medians' ratio tends to the CPU's.
    print(f"  {'agents':>6}   {'up: median':>10} {'p99':>9} {'RSS':>8} {'CPU':>8}   "
          f"{'bare bwraps: median':>19} {'p99':>9} {'RSS':>8} {'CPU':>8}   {'medians':>7} {'CPU':>6}   target ≤ 1.3×")
    # Where a call's CPU goes, the same loop without serve: up's sandbox
    # spawned directly (what its guarantees cost), and its loader given the
    # program's script (what a spare adds).
    plan_agent = os.path.join(scratch, "agent-direct")
    up_starts(SERVER + ["up", "--agent", plan_agent], times=1)[1].close()
    program = ["/usr/bin/sh", *ECHO["args"]]
    argv, filter_path = direct_plan(plan_agent, program)
    from linkrun.processes.spare import LOADER_TAIL, script

    loader_argv = argv[:len(argv) - len(program)] + list(LOADER_TAIL)
    plans = {"sandbox": (argv, filter_path, None),
             "loader": (loader_argv, filter_path, script(program, "", os.path.join(plan_agent, "Files"), False))}
    for count in AGENT_COUNTS:
        folders = [os.path.join(scratch, f"agents-{count}", f"agent-{index}") for index in range(count)]
        through, bare, up_rss, bare_rss, up_cpu, bare_cpu = [], [], 0.0, 0.0, 0.0, 0.0
        direct: dict[str, tuple[list[float], float]] = {name: ([], 0.0) for name in plans}
        for _ in range(2):  # alternated, so that the machine's drift falls on both
            times, peak, cpu = run_clients(up_client, folders)
            through, up_rss, up_cpu = through + times, max(up_rss, peak), up_cpu + cpu / 2
            times, peak, cpu = run_clients(bare_client, folders)
            bare, bare_rss, bare_cpu = bare + times, max(bare_rss, peak), bare_cpu + cpu / 2
            for name, plan in plans.items():
                times, _, cpu = run_clients(functools.partial(direct_client, plan), folders)
                direct[name] = (direct[name][0] + times, direct[name][1] + cpu / 2)
        ratio = median_ms(through) / median_ms(bare)
        up_each, bare_each = up_cpu * 1000, bare_cpu * 1000
        print(f"  {count:>6}   {median_ms(through):>7.1f} ms {p99_ms(through):>6.1f} ms {up_rss:>5.0f} MB "
              f"{up_each:>5.1f} ms   {median_ms(bare):>16.1f} ms {p99_ms(bare):>6.1f} ms {bare_rss:>5.0f} MB "
              f"{bare_each:>5.1f} ms   {ratio:>6.2f}× {up_each / bare_each:>5.2f}×")
        (alone, alone_cpu), (loaded, loaded_cpu) = direct["sandbox"], direct["loader"]
        print(f"  {'':>6}   without serve, against the bare bwraps: up's sandbox spawned directly "
              f"{median_ms(alone):.1f} ms, CPU {alone_cpu * 1000:.1f} ms ({median_ms(alone) / median_ms(bare):.2f}×, "
              f"{alone_cpu / bare_cpu:.2f}×); with its loader {median_ms(loaded):.1f} ms, CPU "
              f"{loaded_cpu * 1000:.1f} ms ({median_ms(loaded) / median_ms(bare):.2f}×, {loaded_cpu / bare_cpu:.2f}×)")
        if count in (1, AGENT_COUNTS[-1]):
            figure(f"`echo hi` through up, {count} agent{'s' if count > 1 else ''} at once (median, p99; RSS)",
                   f"{median_ms(through):.1f} ms, {p99_ms(through):.1f} ms; {up_rss:.0f} MB",
                   f"{count} bare bwrap{'s' if count > 1 else ''}: {median_ms(bare):.1f} ms, "
                   f"{p99_ms(bare):.1f} ms; {bare_rss:.0f} MB")


def pace(files: str) -> None:
    """Issue 26's rows: calls back to back through up against minimal bwraps
    back to back; a call at an agent's pace against the same program spawned
    with no sandbox; serve's own path (the pass-through sandbox) against the
    Node peer where it is installed, else `sh -c` spawned directly plus 0.5 ms."""
    print("pace: calls back to back, at an agent's pace, and serve's own path")
    scratch = os.path.dirname(files)
    server = Server(SERVER + ["up", "--agent", os.path.join(scratch, "agent-pace")])
    server.send(INIT)
    server.wait(0)
    request_ids = iter(range(1, 1_000_000))

    def through(target: Server) -> float:
        request_id = next(request_ids)
        t = time.perf_counter()
        target.call(request_id, ECHO)
        answered, answer = target.wait(request_id)
        if answer["result"].get("isError"):
            raise RuntimeError(f"a call failed: {answer['result']}")
        return answered - t

    def spawned(argv: list[str]) -> float:
        t = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.PIPE, env={"PATH": SYSTEM_PATH})
        return time.perf_counter() - t

    through(server)  # the first call pays for what is loaded once
    minimal = BARE_BWRAP + ["/bin/true"]
    calls, bwraps = [], []
    for _ in range(4):  # blocks alternated, so that the machine's drift falls on both
        time.sleep(1.0)  # the spares a block leaves made again
        calls += [through(server) for _ in range(50)]
        bwraps += [spawned(minimal) for _ in range(50)]
    row("200 `echo hi` back to back through up (median)", f"{median_ms(calls) / median_ms(bwraps):.2f}×",
        "target ≤ 1.2×", f"{median_ms(calls):.2f} ms; minimal bwraps of /bin/true back to back: "
        f"{median_ms(bwraps):.2f} ms")
    row("  the same, p99", f"{p99_ms(calls) / p99_ms(bwraps):.2f}×", "target ≤ 1.5×",
        f"{p99_ms(calls):.2f} ms; the bwraps': {p99_ms(bwraps):.2f} ms")

    echo, plain = [], []
    for _ in range(100):
        for samples, run in ((echo, lambda: through(server)), (plain, lambda: spawned(["sh", *ECHO["args"]]))):
            time.sleep(PACE)
            samples.append(run())
    server.close()
    row("`echo hi` through up at an agent's pace", f"{median_ms(echo) - median_ms(plain):+.2f} ms", "target ≤ +1 ms",
        f"{median_ms(echo):.2f} ms; `sh -c 'echo hi'` spawned directly: {median_ms(plain):.2f} ms")

    passing = Server(serve_argv(files))
    passing.send(INIT)
    passing.wait(0)
    through(passing)
    peer_argv = node_peer()
    peer = None
    if peer_argv is not None:
        peer = Server(peer_argv)
        peer.send(INIT)
        peer.wait(0)
        peer.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    own, theirs = [], []
    for _ in range(100):
        time.sleep(PACE)
        own.append(through(passing))
        time.sleep(PACE)
        theirs.append(peer_call(peer) if peer is not None else spawned(["sh", *ECHO["args"]]))
    passing.close()
    if peer is not None:
        peer.close()
        baseline, named = median_ms(theirs), f"the Node peer: {median_ms(theirs):.2f} ms"
    else:
        baseline = median_ms(theirs) + 0.5
        named = f"no Node peer installed: `sh -c 'echo hi'` spawned directly + 0.5 ms: {baseline:.2f} ms"
    row("`echo hi` through serve, pass-through sandbox", f"{median_ms(own) / baseline:.2f}×", "target ≤ 1×",
        f"{median_ms(own):.2f} ms; {named}")


NODE_PEER = REPO / "tests" / "node" / "node_modules" / "mcp-server-commands" / "build" / "index.js"


def node_peer() -> list[str] | None:
    """The Node peer's argv (a "run a command" MCP server, unsandboxed), where it is installed."""
    node = shutil.which("node")
    return [node, str(NODE_PEER)] if node and NODE_PEER.exists() else None


def peer_call(peer: Server) -> float:
    request_id = int(time.monotonic_ns())
    t = time.perf_counter()
    peer.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
               "params": {"name": "run_command", "arguments": {"command": "echo hi"}}})
    answered, _ = peer.wait(request_id)
    return answered - t


def sleeps_at_once(files: str, rounds: int = 5) -> None:
    """20 × `sleep 0.5` sent at once through up, against the same through
    serve with the pass-through sandbox and 20 bare minimal bwraps of it
    started at once, interleaved."""
    # After a burst, up makes its spares again (up to 16, a few at a time):
    # nothing is timed until they are made.
    settle = 1.0
    scratch = os.path.dirname(files)
    servers = {"up": Server(SERVER + ["up", "--agent", os.path.join(scratch, "agent-sleeps")]),
               "serve": Server(serve_argv(files))}
    for server in servers.values():
        server.send(INIT)
        server.wait(0)
    times: dict[str, list[float]] = {"up": [], "serve": [], "bare": []}
    for round_ in range(rounds):
        for label, server in servers.items():
            ids = range(100 * round_ + 1, 100 * round_ + 21)
            time.sleep(settle)
            t = time.perf_counter()
            for request_id in ids:
                server.call(request_id, {"program": "sh", "args": ["-c", "sleep 0.5"]})
            for request_id in ids:
                if server.wait(request_id)[1]["result"].get("isError"):
                    raise RuntimeError(f"a sleep through {label} failed")
            times[label].append(time.perf_counter() - t)
        time.sleep(settle)
        t = time.perf_counter()
        bare = [subprocess.Popen(BARE_BWRAP + ["sh", "-c", "sleep 0.5"], env={}) for _ in range(20)]
        for process in bare:
            process.wait()
        times["bare"].append(time.perf_counter() - t)
    for server in servers.values():
        server.close()
    up, serve, bare_s = (statistics.median(times[label]) for label in ("up", "serve", "bare"))
    row("20 × `sleep 0.5` at once through up: all answered", f"{up:.3f} s", "target ≤ 0.6 s",
        f"through serve, pass-through sandbox: {serve:.3f} s; 20 minimal bwraps of it at once: {bare_s:.3f} s "
        f"({up / bare_s:.2f}×); one sleep: 0.5 s")
    row("  the first burst of a new serve", f"{times['up'][0]:.3f} s", "target ≤ 0.6 s",
        f"it finds the spares kept at rest; the bwraps' first: {times['bare'][0]:.3f} s "
        f"({times['up'][0] / times['bare'][0]:.2f}×)")
    figure("20 × `sleep 0.5` at once through up (the median of 5 bursts; the first finds the spares kept at rest)",
           f"{up:.3f} s ({up / bare_s:.2f}×); the first: {times['up'][0]:.3f} s",
           f"20 minimal bwraps at once: {bare_s:.3f} s; pass-through sandbox: {serve:.3f} s; 0.5 s")


def repositories(files: str) -> None:
    """A call's time through up with N git repositories in work/ (issue 23,
    D2), now at 0, 64 and 1,000; with LNK_BENCH_BEFORE (a Python whose
    `linkrun` is another checkout, the code before), that code too, in the
    same run, calls of the two alternating."""
    print("repositories: a call through up with N git repositories in work/")
    scratch = os.path.dirname(files)
    template = os.path.join(scratch, "template-repo")
    subprocess.run(["git", "init", "-q", template], check=True)  # the default template: its sample hooks
    before = os.environ.get("LNK_BENCH_BEFORE")
    codes = {"now": SERVER, **({"before": [before, "-I", "-m", "linkrun"]} if before else {})}
    padding = "#" * 9000  # over spare.SCRIPT_LIMIT: the call sets up a sandbox of its own
    medians: dict[tuple[str, int, str], float] = {}
    for count in (0, 64, 1000):
        servers = {}
        # The code before refused every call past 64 repositories (issue 23): it is measured at 0 and 64.
        for label, argv in codes.items() if count <= 64 else [("now", SERVER)]:
            agent = os.path.join(scratch, f"repositories-{label}-{count}")
            work = os.path.join(agent, "Files", "work")
            for i in range(count):  # linked, not copied: the same files, read alike, made fast
                shutil.copytree(template, os.path.join(work, "r", str(i), ".git"), symlinks=True,
                                copy_function=os.link)
            servers[label] = server = Server(argv + ["up", "--agent", agent])
            server.send(INIT)
            server.wait(0)
        samples: dict[tuple[str, str], list[float]] = {}
        refused: dict[str, str] = {}
        for index in range(1, 41):
            for label, server in servers.items():
                for kind, args in (("spare", ["-c", "echo hi"]), ("own", ["-c", "echo hi", padding])):
                    request_id = index * 10 + (kind == "own")
                    time.sleep(PACE)
                    t = time.perf_counter()
                    server.call(request_id, {"program": "sh", "args": args})
                    answered, message = server.wait(request_id)
                    samples.setdefault((label, kind), []).append(answered - t)
                    if message.get("result", {}).get("isError"):
                        refused[label] = message["result"]["content"][0]["text"][:60]
        for server in servers.values():
            server.close()
        for label in servers:
            if label in refused:
                row(f"  {count} repositories, {label}", "refused", "", refused[label])
                continue
            for kind in ("spare", "own"):
                medians[(label, count, kind)] = median_ms(samples[(label, kind)])
            row(f"  {count} repositories, {label}: `echo hi`", f"{medians[(label, count, 'spare')]:.2f} ms", "",
                f"its own sandbox (no spare): {medians[(label, count, 'own')]:.2f} ms")
    for count in (0, 64, 1000):
        for base in (0, 64):
            if ("now", count, "spare") in medians and ("before", base, "spare") in medians:
                row(f"  now at {count} against before at {base}",
                    f"{medians[('now', count, 'spare')] / medians[('before', base, 'spare')]:.2f}×", "",
                    f"its own sandbox: {medians[('now', count, 'own')] / medians[('before', base, 'own')]:.2f}×")


def kept(files: str):
    """A call printing 1 GiB with its output kept past the answer (the ring in <state>/kept/) against
    the same call without (no --keep-* flags: today's path), in turns on fresh servers, so that each
    server's VmHWM is that call's peak; and read with a pattern over a kept stream."""
    print("kept: a call's whole output kept past its answer (pass-through sandbox)")
    state = os.path.join(os.path.dirname(files), "kept-state")
    keep = ["--state", state, "--keep-output", "16M", "--keep-for", "1d", "--keep-total", "256M"]
    for name, script in (("one long line", "head -c 1073741824 /dev/zero"), ("2-byte lines", "yes | head -c 1073741824")):
        kept_flood(files, keep, name, script)
    kept_search(files, keep, state)


def kept_flood(files: str, keep: list[str], name: str, script: str) -> None:
    """One 1 GiB flood, 9 turns of each server."""
    # LNK_BENCH_BASE: a checkout of the commit before kept output, whose serve runs in the same turns.
    base = os.environ.get("LNK_BENCH_BASE")
    labels = ("without", "kept") + (("base",) if base else ())
    times: dict[str, list[float]] = {label: [] for label in labels}
    peaks: dict[str, list[float]] = {label: [] for label in labels}
    cpus: dict[str, list[float]] = {label: [] for label in labels}
    for _ in range(9):
        for label in labels:
            argv = serve_argv(files)
            if label == "kept":
                argv = argv[:-2] + keep + argv[-2:]
            if label == "base":  # isolated as ours, with the base checkout first on the path
                argv = [sys.executable, "-I", "-c", f"import sys, runpy; sys.path.insert(0, {base!r}); "
                        "runpy.run_module('linkrun', run_name='__main__', alter_sys=True)"] + argv[4:]
            server = Server(argv)
            server.send(INIT)
            server.wait(0)
            cpu = cpu_seconds(server.process.pid)
            t = time.perf_counter()
            server.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": "command", "arguments": {"program": "sh", "args": ["-c", script]},
                "_meta": {"link.local/thread": "bench"}}})
            _, answer = server.wait(1)
            times[label].append(time.perf_counter() - t)
            cpus[label].append(cpu_seconds(server.process.pid) - cpu)
            peaks[label].append(status_kb(server.process.pid, "VmHWM") / 1024)
            structured = answer["result"]["structuredContent"]
            assert (label == "kept") == ("output_id" in structured), structured.keys()
            if label == "base":  # the commit before: its own package, not this checkout's
                assert "output_id" not in structured and structured["output_bytes"] == 1 << 30
            server.close()
    without, with_kept = statistics.median(times["without"]), statistics.median(times["kept"])
    row(f"1 GiB on stdout, {name}, kept (median of 9)", f"{with_kept:.3f} s", "target ≤ 1.10×",
        f"not kept, same run: {without:.3f} s ({with_kept / without:.2f}×)")
    row("  serve's CPU for it, kept (median)", f"{statistics.median(cpus['kept']):.3f} s", "",
        f"not kept: {statistics.median(cpus['without']):.3f} s")
    row("  server peak RSS, kept (median)", f"{statistics.median(peaks['kept']):.1f} MB", "target: no growth",
        f"not kept: {statistics.median(peaks['without']):.1f} MB")
    if base:
        then = statistics.median(times["base"])
        row("  the commit before, same run (median)", f"{then:.3f} s", "",
            f"peak {statistics.median(peaks['base']):.1f} MB; kept: {with_kept / then:.2f}× its time")
    figure(f"1 GiB printed by a call ({name}), its output kept", f"{with_kept:.3f} s, peak {statistics.median(peaks['kept']):.1f} MB",
           f"not kept: {without:.3f} s, peak {statistics.median(peaks['without']):.1f} MB")


def kept_search(files: str, keep: list[str], state: str) -> None:
    # read with a pattern over a whole kept stream of 16 MiB of numbered lines, against grep -c over the same file.
    server = Server(serve_argv(files)[:-2] + keep + serve_argv(files)[-2:])
    server.send(INIT)
    server.wait(0)
    meta = {"link.local/thread": "bench"}
    lines = "import sys\nfor i in range(2396745): sys.stdout.write(f'{i:06d}\\n')"
    server.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "command", "arguments": {"program": "python3", "args": ["-c", lines]}, "_meta": meta}})
    kept_id = server.wait(1)[1]["result"]["structuredContent"]["output_id"]
    searches = []
    for index, pattern in enumerate(("7$", "(a+)+b|^12345", "^(0|1)+9$"), start=2):
        t = time.perf_counter()
        server.send({"jsonrpc": "2.0", "id": index, "method": "tools/call", "params": {
            "name": "read", "arguments": {"id": kept_id, "pattern": pattern}, "_meta": meta}})
        found = server.wait(index)[1]["result"]["structuredContent"]
        searches.append((pattern, time.perf_counter() - t, len(found["lines"]) + found["more"]))
    path = os.path.join(state, "kept", f"{kept_id}.out")
    t = time.perf_counter()
    subprocess.run(["grep", "-cE", "7$", path], stdout=subprocess.DEVNULL, check=True)
    grep = time.perf_counter() - t
    server.close()
    for pattern, seconds, count in searches:
        row(f"  read pattern {pattern!r} over 16 MiB", f"{seconds * 1000:.0f} ms", "",
            f"{count} lines; grep -cE '7$' on the file: {grep * 1000:.0f} ms")



def lines(files: str):
    from bench_lines import lines as measure  # tools/, beside this script

    measure(files, row)


def startup(files: str):
    from bench_start import startup as measure  # tools/, beside this script

    measure(files, row)


def write(files: str):
    from bench_write import interactive  # tools/, beside this script

    interactive(files, globals())


GROUPS = {"foundation": foundation, "sandbox": sandbox, "background": background, "told": told,
          "proxy": proxy_group, "faults": faults, "agents": agents, "startup": startup,
          "repositories": repositories, "kept": kept, "lines": lines,
          "write": write, "pace": pace}


README_GROUPS = ("sandbox", "proxy", "background", "agents")  # the groups whose figures README's table shows
README_START, README_END = "<!-- bench: how fast -->", "<!-- bench: end -->"


def main(argv: list[str]) -> int:
    readme = "--readme" in argv
    chosen = [name for name in argv if name != "--readme"] or list(README_GROUPS if readme else GROUPS)
    for name in chosen:
        if name not in GROUPS:
            print(f"unknown group {name!r}; groups: {', '.join(GROUPS)} (and --readme, to write README's "
                  f"figures)", file=sys.stderr)
            return 2
    print(f"Link Run benchmarks · {os.cpu_count()} cores · Python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="linkrun-bench-", ignore_cleanup_errors=True) as scratch:
        files = os.path.join(scratch, "files")
        os.makedirs(os.path.join(files, "work"))
        for name in chosen:
            GROUPS[name](files)
    if readme:
        write_readme(REPO / "README.md", FIGURES)
        print(f"README.md: {len(FIGURES)} figures written")
    return 0


def write_readme(path: Path, figures: dict[str, tuple[str, str]]) -> None:
    """Rewrite the table between README's two markers: the rows measured now,
    and those of groups not run this time as they were."""
    text = path.read_text()
    if README_START not in text or README_END not in text:
        raise SystemExit(f"{path} has no {README_START} … {README_END} markers: put them where the table goes")
    head, rest = text.split(README_START, 1)
    table, tail = rest.split(README_END, 1)
    rows = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("figure", "---"):
            rows[cells[0]] = (cells[1], cells[2])
    rows.update(figures)
    lines = ["", f"Measured by `tools/bench --readme` ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the "
             "end); each baseline in the same run.",
             "", "| figure | Link Run | baseline |", "|---|---|---|"]
    lines += [f"| {name} | {value} | {baseline} |" for name, (value, baseline) in rows.items()]
    path.write_text(head + README_START + "\n".join(lines) + "\n" + README_END + tail)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Link Run's benchmarks: the figures the issues name, measured in one run,
each beside a baseline measured in the same run.

    tools/bench                 # every group
    tools/bench foundation      # one group

Medians over repeated runs; memory from /proc (VmRSS, VmHWM); CPU from
/proc/<pid>/stat. Nothing here is a test: it prints figures, and a person
reads them against the issue's targets.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
SERVER = [sys.executable, "-I", "-m", "linkrun"]
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}
TICKS = os.sysconf("SC_CLK_TCK")


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

    def __init__(self, argv: list[str]):
        self.started = time.perf_counter()
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, cwd=str(REPO))
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

    # Idle CPU: nothing in flight for 2 s.
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
        subprocess.run(["sh", "-c", f"{script} > /dev/null"], check=True)
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
            f"same pipeline to /dev/null: {baseline:.3f} s ({elapsed / baseline:.2f}×)")
        row("  server peak RSS; all bytes counted, cut shown", f"{peak:.1f} MB", "target ≤ 40 MB",
            f"bytes={structured['output_bytes']} cut={kept}")


GROUPS = {"foundation": foundation}


def main(argv: list[str]) -> int:
    chosen = argv or list(GROUPS)
    for name in chosen:
        if name not in GROUPS:
            print(f"unknown group {name!r}; groups: {', '.join(GROUPS)}", file=sys.stderr)
            return 2
    print(f"Link Run benchmarks · {os.cpu_count()} cores · Python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="linkrun-bench-") as scratch:
        files = os.path.join(scratch, "files")
        os.makedirs(os.path.join(files, "work"))
        for name in chosen:
            GROUPS[name](files)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

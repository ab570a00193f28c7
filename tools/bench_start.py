"""tools/bench's `startup` group: from spawning `up` to its `initialize`
answered, as a client starts it, on an idle machine and beside a CPU hog.

`codex exec` asks its model without a server's tools when that takes more
than about a second. Goal: at most 100 ms at the 99th percentile, both ways.
The baseline is a bare interpreter start, measured in the same run.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import orjson

SERVER = [sys.executable, "-I", "-m", "linkrun"]
INIT = orjson.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}) + b"\n"
TIMES = 100


def answered_in(argv: list[str]) -> float:
    """Seconds from spawning `argv` to its first line on stdout, initialize sent at once, as clients do."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(INIT)
    process.stdin.flush()
    line = process.stdout.readline()
    seconds = time.perf_counter() - started
    process.stdin.close()
    process.wait(timeout=30)
    process.stdout.close()
    if b'"result"' not in line:
        raise RuntimeError(f"no initialize answer from {argv}: {line[:200]!r}")
    return seconds


def interpreter_start() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-I", "-c", "pass"], check=True)
    return time.perf_counter() - started


@contextmanager
def cpu_hog() -> Iterator[None]:
    """One process spinning on a core for as long as the block runs."""
    hog = subprocess.Popen([sys.executable, "-I", "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # on a core before the first sample
        yield
    finally:
        hog.kill()
        hog.wait()


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def startup(files: str, row: Callable[..., None] | None = None) -> None:
    print("startup: spawn → initialize answered (`up --no-way-in`, as docs/clients.md starts it)")
    show = row or (lambda name, value, target="", baseline="": print(f"  {name:<52} {value:>18}   {target:<22} {baseline}"))
    agent = os.path.join(os.path.dirname(files), "agent-startup")
    argv = SERVER + ["up", "--agent", agent, "--no-way-in"]
    answered_in(argv)  # the agent's folder made, its /etc view and filter written, once
    for label, beside in (("idle", None), ("beside a CPU hog", cpu_hog)):
        with beside() if beside is not None else _nothing():
            up = [answered_in(argv) for _ in range(TIMES)]
            bare = [interpreter_start() for _ in range(TIMES // 4)]
        show(f"up → initialize answered, {label} (median, p99)",
             f"{statistics.median(up) * 1000:.1f}, {p99(up) * 1000:.1f} ms", "target p99 ≤ 100 ms",
             f"a bare interpreter start: {statistics.median(bare) * 1000:.1f} ms; load average "
             f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


@contextmanager
def _nothing() -> Iterator[None]:
    yield

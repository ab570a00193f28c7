"""tools/bench's `startup` group: from spawning `up` to its `initialize`
answered, as a client starts it, on an idle machine and beside a CPU hog.

`codex exec` asks its model without a server's tools when that takes more
than about a second. Goal: at most 100 ms at the 99th percentile, both ways.
The baseline is a bare interpreter start, measured in the same run; with
LNK_BENCH_AGAINST=<another checkout>, that checkout's `up` too, each start
of it right after one of ours (its package first on the path), so that both
meet the same load, in an agent's folder of its own: the two builds' /etc
rules may differ, and each start in a shared folder would rebuild the other's
/etc view.

The package is compiled first, as an install is: where the environment says
PYTHONDONTWRITEBYTECODE, every start would compile it again.
"""

from __future__ import annotations

import compileall
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import orjson

# As docs/clients.md starts it: the console script beside the interpreter (else the module).
SCRIPT = os.path.join(os.path.dirname(sys.executable), "lnk-link-run")
SERVER = [SCRIPT] if os.access(SCRIPT, os.X_OK) else [sys.executable, "-I", "-m", "linkrun"]
INIT = orjson.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}) + b"\n"
TIMES = 100


def cpu_seconds(pid: int) -> float:
    """The CPU time of a process's threads so far (schedstat: nanoseconds on a CPU)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass  # a thread that ended meanwhile
    return total / 1e9


def answered_in(argv: list[str], cpu: list[float], env: dict[str, str] | None = None) -> float:
    """Seconds from spawning `argv` to its first line on stdout, initialize sent at once, as clients do;
    its CPU time when the answer was read goes to `cpu` (the work it goes on with meanwhile included)."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               env=env)
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(INIT)
    process.stdin.flush()
    line = process.stdout.readline()
    seconds = time.perf_counter() - started
    cpu.append(cpu_seconds(process.pid))
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
    print(f"startup: spawn → initialize answered (`{os.path.basename(SERVER[0])} up --no-way-in`, as docs/clients.md starts it)")
    show = row or (lambda name, value, target="", baseline="": print(f"  {name:<52} {value:>18}   {target:<22} {baseline}"))
    agent = os.path.join(os.path.dirname(files), "agent-startup")
    argv = SERVER + ["up", "--agent", agent, "--no-way-in"]
    their_argv = SERVER + ["up", "--agent", agent + "-against", "--no-way-in"]
    against = os.environ.get("LNK_BENCH_AGAINST")
    import linkrun

    for package in (os.path.dirname(linkrun.__file__), *([os.path.join(against, "linkrun")] if against else [])):
        compileall.compile_dir(package, quiet=1)
    other = {**os.environ, "PYTHONPATH": against} if against else None
    answered_in(argv, [])  # the agent's folder made, its /etc view and filter written, once
    if other is not None:
        answered_in(their_argv, [], other)
    for label, beside in (("idle", None), ("beside a CPU hog", cpu_hog)):
        with beside() if beside is not None else _nothing():
            cpu: list[float] = []
            up, theirs, their_cpu = [], [], []
            for _ in range(TIMES):
                up.append(answered_in(argv, cpu))
                if other is not None:
                    theirs.append(answered_in(their_argv, their_cpu, other))
            bare = [interpreter_start() for _ in range(TIMES // 4)]
        load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        show(f"up → initialize answered, {label} (median, p99)",
             f"{statistics.median(up) * 1000:.1f}, {p99(up) * 1000:.1f} ms", "target p99 ≤ 100 ms",
             f"a bare interpreter start: {statistics.median(bare) * 1000:.1f} ms; its CPU to the answer: "
             f"{statistics.median(cpu) * 1000:.1f} ms; {load}")
        if other is not None:
            show(f"  the same, {against}'s up, each start right after ours",
                 f"{statistics.median(theirs) * 1000:.1f}, {p99(theirs) * 1000:.1f} ms", "",
                 f"its CPU to the answer: {statistics.median(their_cpu) * 1000:.1f} ms; ours ÷ its: median "
                 f"{statistics.median(up) / statistics.median(theirs):.2f}, CPU "
                 f"{statistics.median(cpu) / statistics.median(their_cpu):.2f}")


@contextmanager
def _nothing() -> Iterator[None]:
    yield

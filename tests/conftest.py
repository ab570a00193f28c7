"""Shared test helpers: real `lnk-link-run` processes, spoken to over real pipes.

No mocks: a test starts the server as a user's client would and reads what it
writes. Waits are for conditions with deadlines (`wait_*`), never sleeps.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from site_helpers import SiteServer, serve_site

# Fixtures for every test module: the stand-in way in's (keyring, short_dir, way_ins), the told tests'
# ways in read message by message (ways_in), a serve with background commands (bg); and the leak check.
pytest_plugins = ["standin_helpers", "told_helpers", "background_helpers", "leak_helpers"]

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
# What a user's client runs: the interpreter of our venv, isolated.
SERVER = [PYTHON, "-I", "-m", "linkrun"]
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The pass-through sandbox of the tests: `env -- program args` runs the program as it is.
PASS_THROUGH = ["/usr/bin/env"]
LEGACY = "2025-11-25"
MODERN = "2026-07-28"


def have_sandbox() -> bool:
    return shutil.which("bwrap") is not None


def require_sandbox():
    """Skip a test that needs bubblewrap, unless LNK_REQUIRE_SANDBOX=1 makes that a failure."""
    if have_sandbox():
        return
    if os.environ.get("LNK_REQUIRE_SANDBOX") == "1":
        pytest.fail("bubblewrap is missing and LNK_REQUIRE_SANDBOX=1: install bubblewrap")
    pytest.skip("bubblewrap is missing (set LNK_REQUIRE_SANDBOX=1 to fail instead)")


def serve_argv(files: Path, *extra: str, programs=("sh", "cat", "true", "sleep", "echo", "head", "python3", "env"),
               timeout="2m", output="16K", sandbox=PASS_THROUGH) -> list[str]:
    argv = SERVER + ["serve", "--files", str(files), "--programs-path", SYSTEM_PATH,
                     "--timeout", timeout, "--output", output]
    for program in programs:
        argv += ["--program", program]
    return argv + list(extra) + ["--"] + list(sandbox)


class RawServer:
    """A server process spoken to line by line, as a client does."""

    def __init__(self, argv: list[str], env: dict | None = None, user: int | None = None,
                 group: int | None = None, cwd: str | None = None):
        """user/group: run it as that uid and gid, with no other group (the tests run as root)."""
        self.argv = argv
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env if env is not None else clean_env(), cwd=cwd or str(REPO),
            user=user, group=group, extra_groups=[] if user is not None else None,
        )
        self.lines: queue.Queue = queue.Queue()
        self.raw: list[bytes] = []
        self.stderr = b""
        self.initialized: dict = {}  # the initialize answer's result, once a harness keeps it
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._err_reader.start()
        self._next_id = 1
        self.pending: list[dict] = []

    def _read(self):
        for line in self.process.stdout:
            self.raw.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def _read_stderr(self):
        self.stderr = self.process.stderr.read()

    def send_raw(self, data: bytes):
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def send(self, message):
        self.send_raw(orjson.dumps(message) + b"\n")

    def next_message(self, timeout=10.0):
        line = self.lines.get(timeout=timeout)
        if line is None:
            raise EOFError("the server closed its stdout")
        assert line.endswith(b"\n")
        return orjson.loads(line)

    def wait_response(self, request_id, timeout=10.0):
        """The response with this id (same JSON type); other messages are kept in `pending`."""
        for index, message in enumerate(self.pending):
            if "method" not in message and _same_id(message.get("id"), request_id):
                return self.pending.pop(index)
        deadline = time.monotonic() + timeout
        while True:
            message = self.next_message(timeout=max(0.01, deadline - time.monotonic()))
            if "method" not in message and _same_id(message.get("id"), request_id):
                return message
            self.pending.append(message)

    def request(self, method, params=None, request_id=None, timeout=10.0):
        if request_id is None:
            request_id = self._next_id
            self._next_id += 1
        message = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return self.wait_response(request_id, timeout=timeout)

    def notify(self, method, params=None):
        message = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)

    def initialize(self, version=LEGACY):
        response = self.request("initialize", {
            "protocolVersion": version, "capabilities": {},
            "clientInfo": {"name": "raw-test", "version": "0"},
        })
        self.notify("notifications/initialized")
        return response["result"]

    def call(self, name, arguments=None, meta=None, timeout=30.0, request_id=None):
        params = {"name": name, "arguments": arguments or {}}
        if meta:
            params["_meta"] = meta
        response = self.request("tools/call", params, timeout=timeout, request_id=request_id)
        assert "result" in response, response
        return response["result"]

    def close(self, timeout=5.0) -> int:
        if self.process.stdin and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except BrokenPipeError:
                pass
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self.kill()

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._reader.join(timeout=5)
        self._err_reader.join(timeout=5)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            try:
                stream.close()
            except (BrokenPipeError, OSError):
                pass


def _same_id(a, b) -> bool:
    return type(a) is type(b) and a == b


def clean_env(**extra) -> dict:
    """What an MCP client passes its server: a few variables, nothing of ours but the
    running test's marker (the leak check finds what the test left by it)."""
    env = {k: os.environ[k] for k in ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER") if k in os.environ}
    from leak_helpers import marker_env  # here: a plugin imported before it is registered is not rewritten

    env.update(marker_env())
    env.update(extra)
    return env


def text_of(result: dict) -> str:
    return "".join(block["text"] for block in result["content"] if block["type"] == "text")


def wait_for(condition, timeout=10.0, interval=0.01, what="condition"):
    """Poll a cheap condition until it holds; fail naming it at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def parent_of(pid: int) -> int:
    """The parent of a process: a gate's is its supervisor."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def descendants(pid: int) -> set[int]:
    """Every process below `pid`, through each of its threads' children."""
    found, todo = set(), [pid]
    while todo:
        here = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{here}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{here}/task/{task}/children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def is_spare(pid: int) -> bool:
    """A process of a spare sandbox serve made ahead (its command line holds the loader)."""
    from linkrun.processes.spare import LOADER

    try:
        return LOADER.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def child_running(serve: int, word: bytes) -> int | None:
    """A child of serve with `word` among its command line's words, if one runs."""
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            words = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            if word in words and parent_of(int(name)) == serve:
                return int(name)
        except (OSError, ValueError):
            continue
    return None


def warm_server(serve: int) -> int | None:
    """The warm fork server among serve's children, if one runs."""
    return child_running(serve, b"warm-fork")


def spares_of(serve: int) -> list[int]:
    """The processes of the spare sandboxes below serve's pid."""
    return [pid for pid in descendants(serve) if is_spare(pid)]


def waiting_spares(serve: int) -> int:
    """How many of serve's spare sandboxes wait for a program: a loader runs
    once bwrap was let go, which is after its spare was made ready to take."""
    from linkrun.processes.spare import LOADER_TAIL

    loader = "\0".join(LOADER_TAIL).encode() + b"\0"
    count = 0
    for pid in spares_of(serve):
        try:
            count += Path(f"/proc/{pid}/cmdline").read_bytes() == loader
        except OSError:
            pass
    return count


def spare_ready(serve: int, count: int = 1) -> None:
    """Until `count` of serve's spare sandboxes wait for a program."""
    wait_for(lambda: waiting_spares(serve) >= count, timeout=30, what=f"{count} spare sandbox(es)")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped between the open and the read
        return False


@pytest.fixture
def files(tmp_path: Path) -> Path:
    folder = tmp_path / "files"
    (folder / "work").mkdir(parents=True)
    return folder


def stop_what_runs(state: Path, reason: str = "stopped") -> None:
    """Stop every background command still running under `state`, and wait for its supervisor to end."""
    from linkrun.state import records# here, not at the top: conftest loads before every test, most need none

    left = []
    for command_id in records.ids(str(state)):
        if records.is_held(str(state), command_id):
            try:
                records.write_stop(str(state), command_id, reason)
            except OSError:
                pass
            left.append(command_id)
    for command_id in left:
        wait_for(lambda command_id=command_id: not records.is_held(str(state), command_id), timeout=20,
                 what=f"the supervisor of {command_id} to end")


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    """A state folder for background commands; nothing a test started there may
    outlive it: what still runs at the end is stopped as the agent's service
    stopping would, lost and not told, so that no supervisor lingers telling."""
    folder = tmp_path / "state"
    yield folder
    stop_what_runs(folder, "agent stopping")


@pytest.fixture
def site_server() -> Iterator[SiteServer]:
    """The "internet": a test site on 127.0.0.2, and what it was asked."""
    server = serve_site("127.0.0.2")
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def site(site_server: SiteServer) -> int:
    """The test site's port."""
    return site_server.server_address[1]


@pytest.fixture
def servers():
    """Start servers with `servers(argv)`; each is killed at the end of the test."""
    started: list[RawServer] = []

    def start(argv, env=None) -> RawServer:
        server = RawServer(argv, env=env)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def server(servers, files):
    """A legacy-initialized server over `files` with a pass-through sandbox."""
    s = servers(serve_argv(files))
    s.initialize()
    return s


def kill_quietly(pid: int, sig=signal.SIGKILL):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# `up` as root and as an ordinary user (tests/up_harness.py).

@pytest.fixture(scope="session")
def readable_runtime():
    """The venv an ordinary user runs `up` from (made only when the tests run as root)."""
    from up_harness import make_readable_runtime

    root = make_readable_runtime()
    yield root
    shutil.rmtree(root, ignore_errors=True)


# Flocks for every test run on this machine at once (xdist's workers, and other runs): /etc is the machine's.
HOST_ETC_LOCK = os.path.join(tempfile.gettempdir(), "lnk-link-run-tests-etc")


def _open_lock(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:  # only then O_CREAT: a sticky /tmp refuses it on another user's file, even to root
        return os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)


@contextlib.contextmanager
def host_etc(change: bool) -> Iterator[None]:
    """A test that changes the host's /etc (`change`) runs while none that
    needs it steady does: a change there rebuilds every agent's /etc view,
    and a spare made before it is not taken (a call asserted to run in one
    would run in a sandbox made for it). The gate lets a changer in ahead of
    readers that come after it."""
    gate, lock = _open_lock(HOST_ETC_LOCK + ".gate"), _open_lock(HOST_ETC_LOCK + ".lock")
    try:
        if change:
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(lock, fcntl.LOCK_EX)
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(lock, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield
    finally:
        os.close(lock)
        os.close(gate)


@pytest.fixture
def steady_etc() -> Iterator[None]:
    """No test changes the host's /etc meanwhile (`host_etc`)."""
    with host_etc(change=False):
        yield


@pytest.fixture(params=["root", "user"])
def up_as(request, tmp_path):
    """A real `up --no-way-in` run as root, then as an ordinary user, spoken
    to over MCP (an `Up`); the host's /etc steady meanwhile, unless the test
    changes it itself (`planted_pki`)."""
    from up_harness import run_up, running_as_root

    require_sandbox()
    who = request.param
    if who == "root" and not running_as_root():
        pytest.skip("the root variant needs the tests to run as root")
    if "planted_pki" not in request.fixturenames:
        request.getfixturevalue("steady_etc")
    runtime = request.getfixturevalue("readable_runtime") if who == "user" and running_as_root() else None
    yield from run_up(who, tmp_path, runtime)

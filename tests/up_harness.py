"""`lnk-link-run up` started as root or as an ordinary user, spoken to over MCP.

When the tests run as root, the ordinary user is `lnk-tester` (made once, with
a home under /home), and its `up` runs the system's interpreter from a venv
under /tmp that every user can read, holding copies of our package and its
runtime libraries: the test venv may live where that user cannot read. When
the tests run as an ordinary user, that user is the one they run as, and the
root variant is skipped.

Every `up` starts in a session keyring of its own holding a `user` key with
a secret, and with a secret in its environment: what the sandbox must keep
from its programs.
"""

from __future__ import annotations

import compileall
import fcntl
import importlib.util
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from conftest import LEGACY, SERVER, SYSTEM_PATH, RawServer, stop_what_runs, text_of, wait_for
from leak_helpers import marker_env

from linkrun.state import records
from linkrun.sandboxing.launch import JOIN

TESTER = "lnk-tester"
TESTER_LOCK = "/tmp/lnk-tester-user.lock"
RUNTIME_LIBRARIES = ("linkrun", "orjson", "watchdog", "re2")
SECRET_VARIABLE = "LNK_TEST_SECRET"
KEY_DESCRIPTION = "lnk-test-secret"
# Allows what the tests' programs need; [files] write is left at its default (work/).
SANDBOX_FILE = '[commands]\nallow = ["sh", "python3", "cat", "node"]\n'
# (add_key, keyctl) system call numbers where the tests know them.
KEY_SYSCALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}
# Background commands belong to a conversation.
META = {"link.local/thread": "escape-tests"}

# Joins a new session keyring, adds a `user` key holding argv[2] to it, and
# execs the rest: `up` and all it starts share that keyring, as they would
# share a user's login keyring.
KEYRING_LAUNCHER = """
import ctypes, os, sys
add_key, keyctl = int(sys.argv[1].split(",")[0]), int(sys.argv[1].split(",")[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
KEYCTL_JOIN_SESSION_KEYRING, KEY_SPEC_SESSION_KEYRING = 1, -3
if libc.syscall(ctypes.c_long(keyctl), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), ctypes.c_char_p(None)) < 0:
    sys.exit("cannot join a session keyring: " + os.strerror(ctypes.get_errno()))
secret = sys.argv[3].encode()
if libc.syscall(ctypes.c_long(add_key), ctypes.c_char_p(b"user"), ctypes.c_char_p(sys.argv[2].encode()),
                ctypes.c_char_p(secret), ctypes.c_size_t(len(secret)),
                ctypes.c_long(KEY_SPEC_SESSION_KEYRING)) < 0:
    sys.exit("cannot add a key: " + os.strerror(ctypes.get_errno()))
os.execv(sys.argv[4], sys.argv[4:])
"""


def key_syscalls() -> str | None:
    """"add_key,keyctl": the key system calls' numbers here, or None where the tests do not know them."""
    numbers = KEY_SYSCALLS.get(os.uname().machine)
    return None if numbers is None else ",".join(map(str, numbers))


def running_as_root() -> bool:
    return os.geteuid() == 0


def ensure_tester() -> pwd.struct_passwd:
    """The ordinary user `lnk-tester`, made once; safe under parallel workers."""
    with open(TESTER_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return pwd.getpwnam(TESTER)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", TESTER],
                           check=True, capture_output=True, timeout=60)
            return pwd.getpwnam(TESTER)


def make_readable_runtime() -> Path:
    """A venv of the system's interpreter under /tmp, readable by every user,
    with copies of our package and its runtime libraries: its `bin/python -I
    -m linkrun` works for any user, as serve's sweeps and proxy need."""
    system_python = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not os.access(system_python, os.X_OK):
        raise RuntimeError(f"{system_python} is missing: the ordinary user needs an interpreter it can read")
    root = Path(tempfile.mkdtemp(prefix="lnk-runtime-", dir="/tmp"))
    root.chmod(0o755)
    venv = root / "venv"
    subprocess.run([str(system_python), "-m", "venv", "--without-pip", str(venv)], check=True,
                   capture_output=True, timeout=120)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for name in RUNTIME_LIBRARIES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, f"{name} is not installed"
        shutil.copytree(spec.submodule_search_locations[0], site / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    compileall.compile_dir(str(site), quiet=1)  # so the user, who may not write here, starts fast
    for folder, _, names in os.walk(root):
        os.chmod(folder, 0o755)
        for name in names:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o444)
    return root


@dataclass
class Up:
    """A running `up` for one agent, with what the sandbox must keep from it."""

    who: str  # "root" or "user"
    server: RawServer
    agent: Path
    env_secret: str
    key_secret: str
    tags: list[str] = field(default_factory=list)

    @property
    def state(self) -> Path:
        return self.agent / "State"

    def command(self, program: str, *args: str, timeout: float = 90) -> dict:
        return self.server.call("command", {"program": program, "args": list(args)}, meta=META, timeout=timeout)

    def python(self, code: str, *args: str) -> str:
        """The text of a `command` call of `python3 -c code args`; fails on an error answer."""
        result = self.command("python3", "-c", code, *args)
        assert not result.get("isError"), text_of(result)
        return text_of(result)

    def start(self, program: str, *args: str) -> str:
        result = self.server.call("start", {"program": program, "args": list(args)}, meta=META, timeout=60)
        assert not result.get("isError"), text_of(result)
        return result["structuredContent"]["id"]

    def read(self, command_id: str, offset: int = 0, wait: float = 0) -> tuple[dict, str]:
        arguments = {"id": command_id, "offset": offset, "wait": wait}
        result = self.server.call("read", arguments, meta=META, timeout=wait + 60)
        assert not result.get("isError"), text_of(result)
        return result["structuredContent"], text_of(result)

    def wait_ended(self, command_id: str, timeout: float = 60) -> None:
        """Read with wait, from where its output got to, until the command ended."""
        deadline = time.monotonic() + timeout
        value, _ = self.read(command_id)
        while value["state"] in records.RUNNING_STATES:
            assert time.monotonic() < deadline, f"background command {command_id} did not end"
            value, _ = self.read(command_id, value["next"], wait=10)

    def read_all(self, command_id: str) -> str:
        return self.read(command_id)[1]

    def stop(self, command_id: str) -> str:
        return text_of(self.server.call("stop", {"id": command_id}, meta=META, timeout=60))

    def tag(self) -> str:
        """A unique string to find what a call left behind by its command line; killed at teardown."""
        tag = f"lnk-left-behind-{secrets.token_hex(8)}"
        self.tags.append(tag)
        return tag


def processes_with(marker: str) -> list[int]:
    """Pids of every process on the host whose command line holds `marker`."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(name))
            except OSError:
                pass
    return found


def program_runs(tag: str, name: str = "sh") -> bool:
    """A process named `name` holds the tag: a sandbox's program runs, not only its bwrap and init (which hold it too)."""
    for pid in processes_with(tag):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                return True
        except OSError:
            pass  # ended while we looked
    return False


def kill_tagged(tags: list[str]) -> None:
    """SIGKILL whatever holds a tag, until nothing does."""
    def none_left() -> bool:
        left = [pid for tag in tags for pid in processes_with(tag)]
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return not left
    wait_for(none_left, timeout=30, interval=0.05, what="tagged processes to die")


def stop_background(state: Path) -> None:
    """Stop what still runs of an agent's background commands, and wait until it ended."""
    stop_what_runs(state)


def up_command(python: list[str], agent: Path, sandbox_file: Path, key_secret: str) -> list[str]:
    """`up --no-way-in` for the agent, started in a session keyring of its own holding the key."""
    up = python + ["-m", "linkrun", "up", "--agent", str(agent), "--sandbox", str(sandbox_file), "--no-way-in"]
    syscalls = key_syscalls()
    if syscalls is None:
        return up
    return [python[0], "-I", "-S", "-c", KEYRING_LAUNCHER, syscalls, KEY_DESCRIPTION, key_secret, *up]


def initialize(server: RawServer, who: str) -> None:
    try:
        # up checks the sandbox before it answers: slow on a loaded machine.
        answer = server.request("initialize", {"protocolVersion": LEGACY, "capabilities": {},
                                               "clientInfo": {"name": "escape-test", "version": "0"}}, timeout=60)
        server.initialized = answer["result"]
        server.notify("notifications/initialized")
    except BaseException:
        server.kill()
        raise AssertionError(f"up did not start as {who}: {server.stderr.decode(errors='replace')}") from None


def start_up(who: str, workdir: Path, runtime: Path | None, sandbox_text: str = SANDBOX_FILE,
             join: tuple[str, ...] = (), again: Up | None = None) -> Up:
    """Start `up` for a new agent in workdir, as root or as the ordinary user
    (as root: lnk-tester, from the readable venv `runtime`), with the sandbox
    file `sandbox_text`; `join`: cgroup.procs files it joins first (a subtree
    handed to it); `again`: a second `up` of that agent, with its secrets."""
    env_secret, key_secret = secrets.token_hex(16), secrets.token_hex(16)
    if again is not None:
        env_secret, key_secret = again.env_secret, again.key_secret
    as_tester = who == "user" and running_as_root()
    account = ensure_tester() if as_tester else pwd.getpwuid(os.geteuid())
    home = account.pw_dir if as_tester else str(workdir / "home")
    os.makedirs(home, exist_ok=True)
    sandbox_file = workdir / "sandbox.toml"
    sandbox_file.write_text(sandbox_text)
    python = [str(runtime / "venv" / "bin" / "python"), "-I"] if as_tester and runtime else SERVER[:2]
    argv = up_command(python, workdir / "agent", sandbox_file, key_secret)
    if join:
        argv = ["/bin/sh", "-c", JOIN, "sh", *join, "--", *argv]
    env = {"HOME": home, "PATH": SYSTEM_PATH, "USER": account.pw_name, "LOGNAME": account.pw_name,
           SECRET_VARIABLE: env_secret, **marker_env()}
    if as_tester:
        for path in (workdir, sandbox_file):
            os.chown(path, account.pw_uid, account.pw_gid)
        server = RawServer(argv, env=env, user=account.pw_uid, group=account.pw_gid, cwd=home)
    else:
        server = RawServer(argv, env=env, cwd=home)
    initialize(server, who)
    running_as = os.stat(f"/proc/{server.process.pid}").st_uid
    assert running_as == account.pw_uid, f"up runs as uid {running_as}, not as {account.pw_name}"
    return Up(who, server, workdir / "agent", env_secret, key_secret)


def run_up(who: str, tmp_path: Path, runtime: Path | None, sandbox_text: str = SANDBOX_FILE) -> Iterator[Up]:
    """An `up` as root or as the ordinary user; at the end, nothing of it is left."""
    in_testers_home = who == "user" and running_as_root()
    if in_testers_home:  # not under /tmp, and where the tester may write
        workdir = Path(tempfile.mkdtemp(prefix="lnk-test-", dir=ensure_tester().pw_dir))
    else:
        workdir = tmp_path / "up"
        workdir.mkdir()
    try:
        up = start_up(who, workdir, runtime, sandbox_text)
        try:
            yield up
        finally:
            kill_tagged(up.tags)
            up.server.close(timeout=15)  # as a client ends it: its input closed, SIGKILL only if it hangs
            stop_background(up.state)
            kill_tagged(up.tags)
    finally:
        if in_testers_home:
            wait_for(lambda: _removed(workdir), timeout=30, what=f"{workdir} to be removed")


def _removed(folder: Path) -> bool:
    try:
        shutil.rmtree(folder)
    except FileNotFoundError:
        return True
    except OSError:  # a supervisor may still be writing its last record
        return False
    return True

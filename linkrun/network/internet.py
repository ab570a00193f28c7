"""What serve, the supervisors, `up` and `sandbox` need of the agent's proxy
(DESIGN.md §6): its settings file, a place among its users (starting it
when none runs), the hand-over of a call's sandbox (the proxy then listens
on 127.0.0.1:3128 inside it, before its program runs), and what the proxy
refused.

Cheap to import and stdlib only but orjson: the proxy itself (asyncio) is
`linkrun.network.proxy`, in a process of its own.

Files of the state folder: `proxy.json` (the hosts and the route, written by
`up` from the sandbox file; the proxy reads it again whenever it changes),
`proxy.lock` (held by the running proxy), `proxy.users` (a shared lock per
serve or supervisor that needs it), `proxy/proxy.sock` (its HTTP socket on
the host), `proxy/hand.sock` (where a sandbox is handed to it), `proxy.log` (the
proxy's stderr) and `proxy-refused.log` (one line per refusal: time, host,
and the process ids above the connecting program, to tell calls apart).
"""

from __future__ import annotations

import collections
import fcntl
import os
import select
import struct
import sys
import threading
import time

from ..state import filing, layout
from ..errors import LinkRunError

PORT = 3128  # the proxy's port on each sandbox's own loopback
ADDRESS = f"http://127.0.0.1:{PORT}"
# How long a call's program waits, at most, for the proxy to listen in its sandbox.
HAND_TIMEOUT = 10.0

# The sandbox's environment with [internet] hosts (§6): what curl, pip, git,
# Python and Node read. NO_PROXY keeps the sandbox's own loopback servers direct.
VARIABLES = (
    ("HTTP_PROXY", ADDRESS), ("HTTPS_PROXY", ADDRESS),
    ("http_proxy", ADDRESS), ("https_proxy", ADDRESS),
    ("NO_PROXY", "localhost,127.0.0.1,::1"), ("no_proxy", "localhost,127.0.0.1,::1"),
    ("NODE_USE_ENV_PROXY", "1"),
)



def socket_path(state: str) -> str:
    return os.path.join(state, layout.PROXY_FOLDER, layout.PROXY_SOCKET)


def parse_route(text: str) -> str:
    """`http://host:port`, the agent's route (an HTTP proxy taking CONNECT)."""
    host, _, port = text.removeprefix("http://").rstrip("/").rpartition(":")
    if not text.startswith("http://") or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LinkRunError(f"the route {text!r} is not an HTTP proxy address",
                           "give it as http://host:port, such as http://10.0.0.1:3128")
    return f"http://{host}:{int(port)}"


# What the proxy admits: the [internet] hosts, the agent's route, and the way
# in's port (never reached on an address of this machine or its network,
# whatever the hosts name: DESIGN.md §6). collections, not typing: a
# supervisor that imports this pays for nothing new.
Settings = collections.namedtuple("Settings", "hosts route way_in_port", defaults=(None,))


def write_settings(state: str, hosts: list[str], route: str | None, way_in_port: int | None = None) -> None:
    """The proxy's settings, whole or not at all (a running proxy reads them
    again when they change: the latest `up` decides what it admits)."""
    import orjson

    os.makedirs(state, mode=0o700, exist_ok=True)
    filing.write_whole(os.path.join(state, layout.PROXY_SETTINGS),
                       orjson.dumps({"hosts": list(hosts), "route": route, "way_in_port": way_in_port}))


def read_settings(state: str) -> Settings:
    """The settings in `<state>/proxy.json`; a clear error when it is missing or bad."""
    import orjson

    path = os.path.join(state, layout.PROXY_SETTINGS)
    fix = "lnk-link-run up writes it from the sandbox file's [internet] hosts"
    try:
        with open(path, "rb") as f:
            data = orjson.loads(f.read())
    except FileNotFoundError:
        raise LinkRunError(f"the agent's proxy has no settings: {path} is missing", fix) from None
    except (OSError, orjson.JSONDecodeError) as problem:
        raise LinkRunError(f"the agent's proxy settings {path} cannot be read: {problem}", fix) from None
    if not isinstance(data, dict):
        data = {}
    hosts, route, port = data.get("hosts"), data.get("route"), data.get("way_in_port")
    if (not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts) or not isinstance(route, str | None)
            or not (port is None or isinstance(port, int) and 0 < port < 65536)):
        raise LinkRunError(f"the agent's proxy settings {path} are not a list of hosts, a route and a port", fix)
    return Settings(hosts, parse_route(route) if route else None, port)


class Users:
    """This process's place among the proxy's users: a shared lock on
    `proxy.users`, on a close-on-exec descriptor, held while the process
    lives (the proxy exits once no user holds one). `ensure` starts the proxy
    when none answers, and waits until one does."""

    def __init__(self, state: str):
        self.state = state
        self.fd: int | None = None
        self.proxy: int | None = None  # a pidfd of the proxy that answered: it polls readable once it exits
        self.generation = 0  # counts the proxies that answered: a spare sandbox holds a listener of one
        self.lock = threading.Lock()  # calls on several threads wait for one start

    def ensure(self, timeout: float = 10.0) -> None:
        with self.lock:
            if self.proxy is not None:
                if self._alive():
                    return  # the proxy that answered runs still: no probe, nothing it must wake for
                os.close(self.proxy)
                self.proxy = None
            if self.fd is None:
                read_settings(self.state)  # a clear error here, rather than a proxy that will not start
                fd = os.open(os.path.join(self.state, layout.PROXY_USERS), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                             0o600)
                fcntl.flock(fd, fcntl.LOCK_SH)  # held until close(): longer than any one block
                self.fd = fd
            deadline = time.monotonic() + timeout
            spawned = None
            while (pid := _answers(socket_path(self.state))) is None:
                now = time.monotonic()
                # None running (or one on its way out): start one. A second
                # started meanwhile finds proxy.lock held and leaves at once.
                if not filing.is_held(os.path.join(self.state, layout.PROXY_LOCK)) and (spawned is None or now - spawned > 1.0):
                    _spawn(self.state)
                    spawned = now
                if now > deadline:
                    raise LinkRunError("the agent's internet proxy did not start",
                                       f"its log is {os.path.join(self.state, layout.PROXY_LOG)}")
                time.sleep(0.005)  # no event tells when another process's socket starts listening
            self.proxy = _watch(pid, socket_path(self.state))
            self.generation += 1

    def running(self) -> bool:
        """The proxy that answered last runs still (seen by its pidfd, without a probe or a wait)."""
        with self.lock:
            return self._alive()

    def _alive(self) -> bool:
        # A proxy in its last moments counts as alive: its sockets close before
        # it has exited (and its pidfd polls). A call then is told its sandbox
        # has no internet, as when the proxy dies just after this look; the
        # next ensure, once it has exited, starts another.
        return self.proxy is not None and not select.select([self.proxy], [], [], 0)[0]

    def close(self) -> None:
        with self.lock:
            for fd in (self.fd, self.proxy):
                if fd is not None:
                    os.close(fd)
            self.fd = self.proxy = None


def answering(state: str) -> int | None:
    """A pidfd of the agent's proxy if one answers now (no start, no wait), else None."""
    pid = _answers(socket_path(state))
    return _watch(pid, socket_path(state)) if pid is not None else None


def _answers(path: str) -> int | None:
    """The pid of the proxy listening at `path` (its socket's credentials), or None."""
    try:
        folder = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    import socket  # here: `up` and `sandbox` load this module on the way to serve's first answer

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        probe.connect(short_path(folder, os.path.basename(path)))
        credentials = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid: int = struct.unpack("3i", credentials)[0]
        return pid
    except OSError:
        return None
    finally:
        probe.close()
        os.close(folder)


def _watch(pid: int, path: str) -> int | None:
    """A pidfd of the proxy, so later calls see it alive without a probe;
    None (probe each call) where pidfds are missing or the pid moved on."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
    os.set_inheritable(pidfd, False)
    if _answers(path) != pid:  # it exited between the probe and the pidfd: its pid may be another's
        os.close(pidfd)
        return None
    return pidfd


def hand_over(proxy_dir: str, pidfd: int, pid: int) -> str | None:
    """Have the agent's proxy listen on 127.0.0.1:3128 in the network of the
    sandbox whose init is `pid` (held by `pidfd`), until that init ends.
    Called while bwrap holds the program (`--block-fd`): None once the proxy
    listens there, else why the program will have no internet."""
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    folder = -1
    try:
        sock.settimeout(HAND_TIMEOUT)
        folder = os.open(proxy_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        sock.connect(short_path(folder, layout.PROXY_HAND))
        socket.send_fds(sock, [b"%d" % pid], [pidfd])
        answer = sock.recv(4096)
    except OSError as problem:
        return f"the agent's proxy cannot be reached ({problem}); its log is {os.path.dirname(proxy_dir)}/" \
               f"{layout.PROXY_LOG}"
    finally:
        sock.close()
        if folder >= 0:
            os.close(folder)
    if answer == b"ok":
        return None
    return answer.decode(errors="replace") or "the agent's proxy ended before it listened in the sandbox"


def short_path(folder_fd: int, name: str) -> str:
    """A socket's path through its folder's descriptor: a socket address holds
    at most 107 bytes, and an agent's state folder may lie deeper than that."""
    return f"/proc/self/fd/{folder_fd}/{name}"


def _spawn(state: str) -> None:
    """Start a proxy detached, as supervisors are: a shell puts it in the
    background and exits, so it outlives whoever started it."""
    import subprocess

    argv = [sys.executable, "-I", "-m", "linkrun", "proxy", "--state", state]
    log = os.open(os.path.join(state, layout.PROXY_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        subprocess.run(["/bin/sh", "-c", '"$@" &', "sh", *argv], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=log, start_new_session=True, check=True)
    finally:
        os.close(log)


def proxy_notes(state: str, since: float, pid: int) -> str | None:
    """The notes on the hosts the proxy refused the sandbox `pid` since
    `since`, each once, and on those it allowed and could not reach, with
    why (the last); None when neither."""
    logged = proxy_log(state, since, pid)
    hosts = list(dict.fromkeys(target for target, why in logged if not why))
    unreached = {target: why for target, why in logged if why}
    notes = ([refused_note(hosts, state)] if hosts else []) + ([unreachable_note(unreached)] if unreached else [])
    return " ".join(notes) or None


def proxy_log(state: str, since: float, pid: int | None = None) -> list[tuple[str, str]]:
    """What the proxy logged since `since` (unix seconds), in order: each
    target (`host:port`), and why it was not reached where it was allowed
    ("" where it was refused); with `pid`, only those asked from below that
    process (a call's sandbox), so calls running at once are told their own."""
    try:
        with open(os.path.join(state, layout.PROXY_REFUSED), "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 256 * 1024))  # the tail is enough
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:  # none logged, or the log cannot be read: the answer goes without the note
        return []
    logged: list[tuple[str, str]] = []
    for line in lines:
        fields = line.split(" ", 3)
        try:
            when = float(fields[0])
        except ValueError:
            continue  # the first, cut line of the tail
        if when < since or len(fields) < 2:
            continue
        above = fields[2].split(",") if len(fields) > 2 and fields[2] else []
        if pid is None or not above or str(pid) in above:
            logged.append((fields[1], fields[3] if len(fields) > 3 else ""))
    return logged


def unreachable_note(unreached: dict[str, str]) -> str:
    """The line a call's answer gets when allowed hosts could not be reached during it."""
    each = "; ".join(f"{target}, which the sandbox file allows: {why}" for target, why in unreached.items())
    return f"[the agent's proxy could not reach {each}]"


def refused_note(hosts: list[str], state: str) -> str:
    """The line a call's answer gets when the proxy refused hosts during it."""
    try:
        listed = list(read_settings(state)[0])
        allowed = ", ".join(listed) or "none"
    except LinkRunError:
        listed, allowed = [], "(its settings cannot be read)"
    # With *, what is refused is a port, or a name that resolves to no public address (the proxy's reply says which).
    star = ("; * admits public addresses only: a host that resolves to one of this machine, its network or a "
            "reserved range is reached only when named" if "*" in listed else "")
    return (f"[the agent's proxy refused {', '.join(hosts)}: the sandbox file's [internet] hosts allow "
            f"{allowed} (without a port, only 80 and 443){star}]")

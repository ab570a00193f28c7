"""The agent's internet proxy: HTTP CONNECT and plain HTTP, admitting only
the hosts the sandbox file's [internet] names.

One per agent (`<state>/proxy.lock`). It lives while a serve or a supervisor
holds a shared lock on `<state>/proxy.users`, and exits when none does. What
it admits is `<state>/proxy.json` (linkrun.network.internet), read again whenever it
changes.

A sandbox reaches it on 127.0.0.1:3128 of its own network, where nothing
of the sandbox listens: the proxy holds that listening socket. As a call
starts, bwrap holds its program (`--block-fd`) while serve (or a
supervisor) hands the proxy the sandbox's init, as a pidfd, on
`<state>/proxy/hand.sock` (internet.hand_over). A spare process of the
proxy's enters the sandbox's user and network namespaces, makes the
listener there, passes it to the proxy and answers `ok`; then the program
runs. The proxy serves that listener until the init's pidfd says the
sandbox ended, and closes it (so the sandbox's network ends too). Entering
a user namespace takes a single-threaded process: the spares are forked
ahead by a small maker, itself forked before the proxy starts any thread,
so a call never waits for a fork. The host's side, `proxy/proxy.sock`,
speaks the same HTTP (for the tests, and the users' liveness probe).

asyncio: one thread serves every connection, so a slow client
costs a waiting coroutine, never a blocked worker, and a hundred connections
are a hundred small tasks.

A name is resolved once; the address checked is the address connected. A
target whose address is loopback, private, link-local or otherwise not
global is refused unless the list names it exactly (a name or an address):
the way in and the host's own services stay out of reach. An IPv6 address
carrying an IPv4 one (NAT64, 6to4, mapped...) is judged by that IPv4 address.

One sandbox cannot use up the proxy's descriptors: each (a call's
listener; on the host's socket, a pid namespace) holds at most
`sandbox_cap()` connections; a request must arrive within
HEAD_TIMEOUT, and a tunnel idle either way for TUNNEL_IDLE is closed.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import errno
import fcntl
import functools
import ipaddress
import os
import resource
import signal
import socket
import struct
import sys
import time

from . import internet
from ..detached import records
from ..config import split_flags
from ..errors import LinkRunError, UsageError

HEAD_MAX = 64 * 1024
# A client sends its request as it connects: a silent one only holds a descriptor.
HEAD_TIMEOUT = float(os.environ.get("LNK_PROXY_HEAD_TIMEOUT", "10"))
# Nothing either way for ten minutes: closed. Servers and NAT gateways drop
# idle connections sooner (a minute or a few), so a live one sends keep-alives.
TUNNEL_IDLE = float(os.environ.get("LNK_PROXY_IDLE_TIMEOUT", "600"))
PER_SANDBOX = 256  # connections one sandbox may hold open at once (a browser's own limit)
CONNECT_TIMEOUT = 10.0
CHUNK = 256 * 1024
USERS_CHECK = 1.0  # seconds between looks for a remaining user (no event exists for a flock's release)
REFUSED_MAX = 1024 * 1024  # then the refusal log starts afresh (the old one is kept as .old)
SPARES = 2  # processes forked ahead, each to make one sandbox's listener
BACKLOG = 256  # connections a listener queues before the proxy accepts them


class Rules:
    """The [internet] hosts: exact names, `*.example.com`, optional `:port`; `*` any public host."""

    def __init__(self, hosts: list[str]):
        self.hosts = hosts
        self.any = "*" in hosts
        self.entries = []
        for entry in hosts:
            if entry == "*":
                continue
            name, port = entry, None
            if entry.rsplit(":", 1)[-1].isdigit() and entry.count(":") == 1:
                name, port_text = entry.rsplit(":", 1)
                port = int(port_text)
            self.entries.append((name.lower().rstrip("."), port))

    def admits(self, host: str, port: int) -> tuple[bool, bool]:
        """(admitted, named exactly): a named target may be private or loopback."""
        host = host.lower().rstrip(".")
        for name, allowed_port in self.entries:
            ports_ok = port == allowed_port if allowed_port is not None else port in (80, 443)
            if not ports_ok:
                continue
            if name == host:
                return True, True
            if name.startswith("*.") and host.endswith(name[1:]) and host != name[2:]:
                return True, False
        if self.any and port in (80, 443):
            return True, False
        return False, False

    def describe(self) -> str:
        return ", ".join(self.hosts) if self.hosts else "none"


def split_authority(text: str, default_port: str | None) -> tuple[str, str]:
    """`host:port`, `[v6]:port` or a bare host → (host, port text; "" when missing)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else (default_port or "")
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, port
    return text, default_port or ""


# IPv6 forms whose last 32 bits are an IPv4 address a gateway may reach:
# IPv4-compatible, IPv4-mapped, SIIT's IPv4-translated, NAT64's well-known prefix.
_LAST_32_BITS_IPV4 = tuple(ipaddress.ip_network(n) for n in ("::/96", "::ffff:0:0/96", "::ffff:0:0:0/96", "64:ff9b::/96"))
# Never public: site-local (deprecated), and NAT64's local-use prefix, whose
# IPv4 lies where the network's own prefix length puts it (RFC 6052).
_NOT_PUBLIC_V6 = tuple(ipaddress.ip_network(n) for n in ("fec0::/10", "64:ff9b:1::/48"))


def public(address: str) -> bool:
    """A global unicast address; an IPv6 one that embeds an IPv4 address is judged by that."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if any(ip in network for network in _NOT_PUBLIC_V6):
            return False
        if any(ip in network for network in _LAST_32_BITS_IPV4):
            ip = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        elif ip.sixtofour:
            ip = ip.sixtofour
    return ip.is_global and not ip.is_multicast


def sandbox_cap(descriptors: int) -> int:
    """Connections one sandbox may hold: PER_SANDBOX, and at most a sixteenth
    of the proxy's descriptors, so that a sandbox at its cap, all of them
    tunnels (two descriptors each), holds at most an eighth."""
    return max(1, min(PER_SANDBOX, descriptors // 16))


class Proxy:
    def __init__(self, state: str, descriptors: int = 1024):
        self.state = state
        self.cap = sandbox_cap(descriptors)
        self.held: collections.Counter[str] = collections.Counter()  # connections held, by sandbox
        self.at_cap: set[str] = set()  # sandboxes told of in the log, until they drop below the cap
        self.settings_path = os.path.join(state, internet.SETTINGS)
        self.refused_log = os.path.join(state, internet.REFUSED)
        self.seen: tuple[int, int, int] | None = None
        self.rules = Rules([])
        self.route: tuple[str, int] | None = None
        self.way_in_port: int | None = None
        self.reload()

    def reload(self) -> None:
        """Read the settings again when the file changed (a stat per
        connection): the latest `up` decides what is admitted, also for a
        background command that outlived the serve that started it."""
        try:
            info = os.stat(self.settings_path)
        except FileNotFoundError:
            return  # kept: what was last read (or nothing, at the start)
        seen = (info.st_ino, info.st_mtime_ns, info.st_size)
        if seen == self.seen:
            return
        try:
            hosts, route, self.way_in_port = internet.read_settings(self.state)
        except LinkRunError as problem:
            print(f"lnk-link-run proxy: {problem.message}; the hosts read before are kept", file=sys.stderr, flush=True)
            return
        self.seen, self.rules = seen, Rules(hosts)
        self.route = _address(route) if route else None
        print(f"lnk-link-run proxy: hosts: {self.rules.describe()}" + (f", through {route}" if route else ""),
              file=sys.stderr, flush=True)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     init: int | None = None) -> None:
        """One connection: on a sandbox's listener (`init`, its init's pid),
        or on the host's socket (its peer's pid namespace is its sandbox)."""
        caller = init if init is not None else _peer_pid(writer)
        sandbox = f"the sandbox of pid {init}" if init is not None else _sandbox_of(caller)
        if self.held[sandbox] >= self.cap:
            return await self.over_cap(writer, sandbox)
        self.held[sandbox] += 1
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
            await self.serve(head, reader, writer, caller)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, OSError):
            pass
        finally:
            writer.close()
            self.held[sandbox] -= 1
            if self.held[sandbox] < self.cap:
                self.at_cap.discard(sandbox)
            if not self.held[sandbox]:
                del self.held[sandbox]

    def received(self, channel: socket.socket) -> None:
        """A listener a spare made in a sandbox, with that sandbox's init."""
        try:
            message, fds, _, _ = socket.recv_fds(channel, 64, 2)
        except (BlockingIOError, InterruptedError):
            return
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            return
        listener, init = socket.socket(fileno=fds[0]), fds[1]
        asyncio.get_running_loop().create_task(self.serve_sandbox(listener, init, int(message)))

    async def serve_sandbox(self, listener: socket.socket, init: int, pid: int) -> None:
        """Serve a sandbox's listener until its init ends, then close it: a
        listener held here would keep the sandbox's network alive."""
        loop = asyncio.get_running_loop()
        ended = loop.create_future()
        try:
            server = await asyncio.start_server(functools.partial(self.handle, init=pid), sock=listener,
                                                limit=HEAD_MAX)
            loop.add_reader(init, _settle, ended)  # a pidfd polls readable once its process exited
            try:
                await ended
            finally:
                loop.remove_reader(init)
                server.close()
        finally:
            listener.close()
            os.close(init)

    async def over_cap(self, writer: asyncio.StreamWriter, sandbox: str) -> None:
        """A 503 at once, without reading the request: the descriptor is free again as soon as it is sent."""
        why = (f"this sandbox holds {self.cap} connections through it, the most one sandbox may "
               "(so that it cannot take the internet from the others)")
        if sandbox not in self.at_cap:  # once while it stays at the cap: a loop of connects fills no log
            self.at_cap.add(sandbox)
            print(f"lnk-link-run proxy: refusing new connections of {sandbox}: {why}", file=sys.stderr, flush=True)
        try:
            await self.answer(writer, 503, "Service Unavailable",
                              f"Link Run's proxy refused this connection: {why}. Close some, or wait for them to end.")
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def serve(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    caller: int | None) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            return await self.answer(writer, 400, "Bad Request", "the request line is not METHOD TARGET VERSION")
        method, target, version = parts
        if method == "CONNECT":
            host, port_text = split_authority(target, None)
            rest = b""
        else:
            if not target.startswith("http://"):
                return await self.answer(writer, 400, "Bad Request",
                                         "this proxy takes CONNECT, or plain HTTP with an absolute http:// URL")
            authority, slash, path = target[len("http://"):].partition("/")
            host, port_text = split_authority(authority, "80")
            headers = [line for line in lines[1:] if line and not line.lower().startswith(("proxy-", "connection:"))]
            rest = "\r\n".join([f"{method} {slash}{path} {version}", *headers, "Connection: close", "", ""]).encode("latin-1")
        if not host or not port_text.isdigit():
            return await self.answer(writer, 400, "Bad Request", f"cannot read a host and port in {target!r}")
        port = int(port_text)
        self.reload()
        admitted, named = self.rules.admits(host, port)
        if not admitted:
            return await self.refuse(writer, host, port, "is not among the hosts it allows", caller)
        try:
            upstream_reader, upstream_writer = await self.connect(host, port, named)
        except PermissionError as why:
            return await self.refuse(writer, host, port, str(why), caller)
        except (TimeoutError, OSError) as problem:
            return await self.answer(writer, 502, "Bad Gateway", f"cannot reach {host}:{port}: {problem}")
        if method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
        else:
            upstream_writer.write(rest)
        try:
            await tunnel(reader, writer, upstream_reader, upstream_writer)
        finally:
            upstream_writer.close()

    async def connect(self, host: str, port: int, named: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [str(info[4][0]) for info in infos]
        if port == self.way_in_port and not all(public(a) for a in addresses):
            raise PermissionError(f"is the way in's port on an address of this machine or its network "
                                  f"({', '.join(sorted(set(addresses)))}), which no sandbox may reach")
        allowed = [a for a in addresses if named or public(a)]
        if not allowed:
            raise PermissionError(f"resolves to {', '.join(sorted(set(addresses)))}, an address of this "
                                  "machine or its network, which only a host named in the list may reach")
        problem: Exception = OSError("no address")
        for address in dict.fromkeys(allowed):  # each checked address in turn (localhost: ::1, then 127.0.0.1)
            try:
                return await self.open(address, port)
            except (TimeoutError, OSError) as failed:
                problem = failed
        raise problem

    async def open(self, address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.route is None:
            return await asyncio.wait_for(asyncio.open_connection(address, port), CONNECT_TIMEOUT)
        # Through the agent's route: every admitted connection goes out there.
        r, w = await asyncio.wait_for(asyncio.open_connection(*self.route), CONNECT_TIMEOUT)
        target = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        w.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        try:
            reply = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), CONNECT_TIMEOUT)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            w.close()
            raise OSError("the route closed the connection without an answer") from None
        if reply.split(b" ", 2)[1:2] != [b"200"]:
            w.close()
            raise OSError(f"the route refused it ({reply.splitlines()[0].decode('latin-1')})")
        return r, w

    async def refuse(self, writer: asyncio.StreamWriter, host: str, port: int, why: str, caller: int | None) -> None:
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.log_refusal(target, caller)
        await self.answer(writer, 403, "Forbidden",
                          f"Link Run's proxy refused {target}: it {why}. The sandbox file's [internet] "
                          f"hosts allow: {self.rules.describe()} (without a port, only 80 and 443).")

    def log_refusal(self, target: str, caller: int | None) -> None:
        """One line for serve and the supervisors: the time, the target, and
        the processes from `caller` up (a call's sandbox's init, then its
        bwrap, ...), so each call is told only its own."""
        above = _ancestors(caller)
        try:
            if os.path.exists(self.refused_log) and os.path.getsize(self.refused_log) > REFUSED_MAX:
                os.replace(self.refused_log, self.refused_log + ".old")  # readers need only the latest
            with open(self.refused_log, "a") as f:
                f.write(f"{time.time():.3f} {target} {','.join(map(str, above))}\n")
        except OSError as problem:  # a full disk: the program still gets its 403, the answer no note
            print(f"lnk-link-run proxy: cannot log the refusal of {target}: {problem}", file=sys.stderr, flush=True)

    @staticmethod
    async def answer(writer: asyncio.StreamWriter, status: int, reason: str, text: str) -> None:
        body = (text + "\n").encode()
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()


async def tunnel(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                 upstream_reader: asyncio.StreamReader, upstream_writer: asyncio.StreamWriter) -> None:
    """Both ways at once, until both ends are done or nothing moved either
    way for TUNNEL_IDLE (the caller closes both ends)."""
    loop = asyncio.get_running_loop()
    moved = [loop.time()]  # when bytes last went either way
    both = asyncio.gather(pipe(client_reader, upstream_writer, moved), pipe(upstream_reader, client_writer, moved))
    while not both.done():
        idle_until = moved[0] + TUNNEL_IDLE
        if loop.time() >= idle_until:
            both.cancel()
            break
        await asyncio.wait([both], timeout=idle_until - loop.time())
    await asyncio.wait([both])  # cancelled or done: its result is not wanted


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, moved: list[float]) -> None:
    loop = asyncio.get_running_loop()
    try:
        while data := await reader.read(CHUNK):
            moved[0] = loop.time()
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _address(route: str) -> tuple[str, int]:
    host, _, port = route.removeprefix("http://").rpartition(":")
    return host.strip("[]"), int(port)


def _peer_pid(writer: asyncio.StreamWriter) -> int | None:
    sock = writer.get_extra_info("socket")
    try:
        pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except (OSError, AttributeError):
        return None
    return pid or None


NS_GET_PARENT = 0xB702  # ioctl: the pid namespace above this one (linux/nsfs.h)


@functools.cache
def _own_pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino  # the proxy never leaves it: read once


def _sandbox_of(pid: int | None) -> str:
    """What the per-sandbox cap counts by: the pid namespace the connecting
    process is in (on the host's socket), or the one that holds it just below ours, so that namespaces
    a program makes inside count as its sandbox. Else its pid, else one
    bucket for peers already gone."""
    if pid is None:
        return "unknown peer"
    try:
        namespace = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return f"pid {pid}" if os.path.exists(f"/proc/{pid}") else "unknown peer"
    try:
        ours = _own_pid_namespace()
        while (found := os.fstat(namespace).st_ino) != ours:
            try:
                parent = fcntl.ioctl(namespace, NS_GET_PARENT)
            except OSError:  # above it lies none we can see
                break
            if os.fstat(parent).st_ino == ours:
                os.close(parent)
                break
            os.close(namespace)
            namespace = parent
        return f"pid namespace {found}"
    finally:
        os.close(namespace)


def _ancestors(pid: int | None, depth: int = 12) -> list[int]:
    """`pid` and the processes above it, as far as /proc shows them."""
    found: list[int] = []
    while pid and pid > 1 and len(found) < depth:
        found.append(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rpartition(b")")[2].split()[1])  # after the name: state, ppid
        except (OSError, ValueError, IndexError):
            break
    return found


def main(argv: list[str]) -> int:
    flags, _ = split_flags(argv, {"--state"}, set(), set())
    if "--state" not in flags:
        raise UsageError("proxy needs --state <dir>", "serve and the supervisors start it; lnk-link-run up "
                         "writes its settings from the sandbox file's [internet] hosts")
    state = os.path.abspath(str(flags["--state"]))
    descriptors = _raise_descriptor_limit()
    internet.read_settings(state)  # a clear error in the log, rather than a proxy admitting nothing
    lock = os.open(os.path.join(state, records.PROXY_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another proxy serves this agent
    folder = os.path.join(state, internet.FOLDER)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)  # no sandbox sees it: only the agent's own serve and supervisors
    # Before any thread: the maker is forked from a process that has one.
    hand = _bind(folder, records.PROXY_HAND, socket.SOCK_SEQPACKET)
    channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    _start_maker(hand, theirs, keep=(lock,))
    hand.close()
    theirs.close()
    listener = _bind(folder, internet.SOCKET, socket.SOCK_STREAM)
    print(f"lnk-link-run proxy: serving {folder}/{internet.SOCKET}", file=sys.stderr, flush=True)
    asyncio.run(_serve(Proxy(state, descriptors), listener, channel, state))
    return 0


def _bind(folder: str, name: str, kind: int) -> socket.socket:
    """A listening Unix socket `folder/name`, made under a temporary name and
    renamed: a restarted proxy replaces the socket whole."""
    sock = socket.socket(socket.AF_UNIX, kind)
    temporary = f".{name}.{os.getpid()}"
    folder_fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        sock.bind(internet.short_path(folder_fd, temporary))
        os.chmod(temporary, 0o600, dir_fd=folder_fd)
        sock.listen(BACKLOG)
        os.rename(temporary, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    finally:
        os.close(folder_fd)
    return sock


# -- The listeners inside sandboxes ------------------------------------------

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000  # linux/sched.h
PR_SET_PDEATHSIG = 1
IP_FREEBIND = 15  # linux/in.h: bind before the sandbox's loopback is up


def _start_maker(hand: socket.socket, channel: socket.socket, keep: tuple[int, ...]) -> None:
    """Fork the maker: it keeps SPARES processes waiting on `hand`, each of
    which serves one hand-over and exits, and forks another for each that
    ended. It and its spares die with the proxy (a parent-death signal)."""
    libc = ctypes.CDLL(None, use_errno=True)
    proxy = os.getpid()
    if os.fork() != 0:
        return
    try:
        for fd in keep:
            os.close(fd)  # the proxy's lock is the proxy's alone
        if _die_with(libc, proxy):
            _keep_spares(libc, hand, channel)
    finally:
        os._exit(0)


def _die_with(libc: ctypes.CDLL, parent: int) -> bool:
    """Killed when `parent` ends; False when it ended already."""
    return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0 and os.getppid() == parent


def _keep_spares(libc: ctypes.CDLL, hand: socket.socket, channel: socket.socket) -> None:
    maker = os.getpid()
    spares = 0
    while True:
        while spares < SPARES:
            if os.fork() == 0:
                try:
                    if _die_with(libc, maker):
                        _serve_one(libc, hand, channel)
                finally:
                    os._exit(0)
            spares += 1
        os.wait()
        spares -= 1


def _serve_one(libc: ctypes.CDLL, hand: socket.socket, channel: socket.socket) -> None:
    """One hand-over: a pidfd of a sandbox's init (and its pid) in, a
    listener made in that sandbox's network out to the proxy, `ok` (or why
    not) back to the caller."""
    caller, _ = hand.accept()
    with caller:
        caller.settimeout(internet.HAND_TIMEOUT)
        try:
            message, fds, _, _ = socket.recv_fds(caller, 64, 1)
        except OSError:
            return
        if len(fds) != 1 or not message.isdigit():
            for fd in fds:
                os.close(fd)
            caller.send(b"the hand-over is a pid and a pidfd of the sandbox's init")
            return
        try:
            listener = _listen_inside(libc, fds[0])
            socket.send_fds(channel, [message], [listener.fileno(), fds[0]])
        except Exception as problem:  # the caller is told, whatever it was: its program waits for the answer
            caller.send(f"the agent's proxy cannot listen in the sandbox: {problem}".encode())
            return
        caller.send(b"ok")


def _listen_inside(libc: ctypes.CDLL, pidfd: int) -> socket.socket:
    """A socket listening on 127.0.0.1:PORT in the network of the process
    `pidfd` holds. Its user namespace first: only a member with
    CAP_SYS_ADMIN there may enter its network (as root, one already is,
    and entering that user namespace is still allowed)."""
    host_network = os.stat("/proc/self/ns/net").st_ino
    error = 0
    for namespaces in (CLONE_NEWUSER | CLONE_NEWNET, CLONE_NEWNET):  # the second: a sandbox in our own user namespace
        error = 0 if libc.setns(pidfd, namespaces) == 0 else ctypes.get_errno()
        if error != errno.EINVAL:
            break
    if error:
        raise OSError(error, f"cannot enter its namespaces: {os.strerror(error)}")
    if os.stat("/proc/self/ns/net").st_ino == host_network:  # never a listener on the host's own loopback
        raise OSError(errno.EINVAL, "the process handed over has no network of its own")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    listener.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
    listener.bind(("127.0.0.1", internet.PORT))
    listener.listen(BACKLOG)
    return listener


def _raise_descriptor_limit() -> int:
    """The soft descriptor limit raised to the hard one (every connection
    costs one, a tunnel two); the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    except (ValueError, OSError) as problem:
        print(f"lnk-link-run proxy: keeps {soft} descriptors: {problem}", file=sys.stderr, flush=True)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


async def _serve(proxy: Proxy, listener: socket.socket, channel: socket.socket, state: str) -> None:
    server = await asyncio.start_unix_server(proxy.handle, sock=listener, limit=HEAD_MAX)
    channel.setblocking(False)
    asyncio.get_running_loop().add_reader(channel, proxy.received, channel)
    users = os.open(os.path.join(state, records.PROXY_USERS), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    async with server:
        while True:
            await asyncio.sleep(USERS_CHECK)
            try:
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a serve or a supervisor still needs us
            break  # nobody: stop (the exclusive lock keeps a newcomer waiting until we are gone)
    os.close(users)

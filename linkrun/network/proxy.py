"""The agent's internet proxy: HTTP CONNECT and plain HTTP, admitting only
the hosts the sandbox file's [internet] names (rules.py).

One per agent (`<state>/proxy.lock`). It lives while a serve or a supervisor
holds a shared lock on `<state>/proxy.users`, and exits when none does. What
it admits is `<state>/proxy.json` (internet.py), read again whenever it
changes.

A sandbox reaches it on 127.0.0.1:3128 of its own network, where nothing
of the sandbox listens: the proxy holds that listening socket. As a call
starts, bwrap holds its program (`--block-fd`) while serve (or a
supervisor) hands the sandbox's init, as a pidfd, to
`<state>/proxy/hand.sock` (internet.hand_over). There a small process of
the proxy's (handover.py, started by listeners.py) makes the listener in
the sandbox's network and passes it here with the pidfd; then the program
runs. The proxy serves that listener until the init's pidfd says the
sandbox ended, and closes it (so the sandbox's network ends too). The host's side, `proxy/proxy.sock`, speaks the same HTTP (for
the tests, and the users' liveness probe).

asyncio: one thread serves every connection, so a slow client
costs a waiting coroutine, never a blocked worker, and a hundred connections
are a hundred small tasks.

A name is resolved once; the address checked is the address connected.
One sandbox cannot use up the proxy's descriptors: each (a call's
listener; on the host's socket, a pid namespace: peers.py) holds at most
`sandbox_cap()` connections; a request must arrive within
HEAD_TIMEOUT, and a tunnel idle either way for TUNNEL_IDLE is closed.
"""

from __future__ import annotations

import asyncio
import collections
import fcntl
import functools
import os
import resource
import socket
import time

from .. import logger
from . import internet, listeners, peers, rules
from ..state import layout
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
        self.settings_path = os.path.join(state, layout.PROXY_SETTINGS)
        self.refused_log = os.path.join(state, layout.PROXY_REFUSED)
        self.seen: tuple[int, int, int] | None = None
        self.rules = rules.Rules([])
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
            logger.warning(f"{problem.message}; the hosts read before are kept")
            return
        self.seen, self.rules = seen, rules.Rules(hosts)
        self.route = _address(route) if route else None
        logger.info(f"hosts: {self.rules.describe()}" + (f", through {route}" if route else ""))

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     init: int | None = None) -> None:
        """One connection: on a sandbox's listener (`init`, its init's pid),
        or on the host's socket (its peer's pid namespace is its sandbox)."""
        caller = init if init is not None else peers.peer_pid(writer)
        sandbox = f"the sandbox of pid {init}" if init is not None else peers.sandbox_of(caller)
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

    def serve_soon(self, listener: socket.socket, init: int, pid: int) -> None:
        """A listener made in a sandbox, with a pidfd of its init and that init's pid (listeners.py)."""
        asyncio.get_running_loop().create_task(self.serve_sandbox(listener, init, pid))

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
            logger.warning(f"refusing new connections of {sandbox}: {why}")
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
            host, port_text = rules.split_authority(target, None)
            rest = b""
        else:
            if not target.startswith("http://"):
                return await self.answer(writer, 400, "Bad Request",
                                         "this proxy takes CONNECT, or plain HTTP with an absolute http:// URL")
            authority, slash, path = target[len("http://"):].partition("/")
            host, port_text = rules.split_authority(authority, "80")
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
            return await self.unreachable(writer, host, port, why_unreached(problem), caller)
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
        if port == self.way_in_port and not all(rules.public(a) for a in addresses):
            raise PermissionError(f"is the way in's port on an address of this machine or its network "
                                  f"({', '.join(sorted(set(addresses)))}), which no sandbox may reach")
        allowed = [a for a in addresses if named or rules.public(a)]
        if not allowed:
            raise PermissionError(f"resolves to {', '.join(sorted(set(addresses)))}, not a public address (one "
                                  "of this machine, its network or a reserved range), which only a host named in "
                                  "the list may reach")
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

    async def unreachable(self, writer: asyncio.StreamWriter, host: str, port: int, why: str,
                          caller: int | None) -> None:
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.log_refusal(target, caller, why)
        await self.answer(writer, 502, "Bad Gateway", f"Link Run's proxy could not reach {target}: {why}.")

    def log_refusal(self, target: str, caller: int | None, unreached: str = "") -> None:
        """One line for serve and the supervisors: the time, the target, and
        the processes from `caller` up (a call's sandbox's init, then its
        bwrap, ...), so each call is told only its own; for an allowed target
        that could not be reached, why, as the rest of the line."""
        above = peers.ancestors(caller)
        line = f"{time.time():.3f} {target} {','.join(map(str, above))}" + (f" {unreached}" if unreached else "")
        try:
            if os.path.exists(self.refused_log) and os.path.getsize(self.refused_log) > REFUSED_MAX:
                os.replace(self.refused_log, self.refused_log + ".old")  # readers need only the latest
            with open(self.refused_log, "a") as f:
                f.write(line.replace("\n", " ") + "\n")
        except OSError as problem:  # a full disk: the program still gets its answer, the call no note
            logger.warning(f"cannot log the refusal of {target}: {problem}")

    @staticmethod
    async def answer(writer: asyncio.StreamWriter, status: int, reason: str, text: str) -> None:
        body = (text + "\n").encode()
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()


def why_unreached(problem: BaseException) -> str:
    """An allowed target's connection that failed, in words a model can act on."""
    if isinstance(problem, ConnectionRefusedError):
        return "the connection was refused (nothing listens on that port)"
    if isinstance(problem, TimeoutError):
        return f"no answer within {CONNECT_TIMEOUT:g} s"
    if isinstance(problem, socket.gaierror):
        return f"its name does not resolve ({problem.strerror})"
    return problem.strerror if isinstance(problem, OSError) and problem.strerror else str(problem)


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


def main(argv: list[str]) -> int:
    flags, _ = split_flags(argv, {"--state"}, set(), set())
    if "--state" not in flags:
        raise UsageError("proxy needs --state <dir>", "serve and the supervisors start it; lnk-link-run up "
                         "writes its settings from the sandbox file's [internet] hosts")
    state = os.path.abspath(str(flags["--state"]))
    descriptors = _raise_descriptor_limit()
    internet.read_settings(state)  # a clear error in the log, rather than a proxy admitting nothing
    lock = os.open(os.path.join(state, layout.PROXY_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another proxy serves this agent
    folder = os.path.join(state, layout.PROXY_FOLDER)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)  # no sandbox sees it: only the agent's own serve and supervisors
    proxy = Proxy(state, descriptors)
    hand_over = listeners.HandOver(folder, proxy.serve_soon)
    hand_over.start()  # before proxy.sock: a user that finds the proxy finds its hand-over too
    listener = listeners.bind_unix(folder, layout.PROXY_SOCKET, socket.SOCK_STREAM)
    logger.info(f"serving {folder}/{layout.PROXY_SOCKET}")
    asyncio.run(_serve(proxy, listener, hand_over, state))
    return 0


def _raise_descriptor_limit() -> int:
    """The soft descriptor limit raised to the hard one (every connection
    costs one, a tunnel two); the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    except (ValueError, OSError) as problem:
        logger.warning(f"keeps {soft} descriptors: {problem}")
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


async def _serve(proxy: Proxy, listener: socket.socket, hand_over: listeners.HandOver, state: str) -> None:
    server = await asyncio.start_unix_server(proxy.handle, sock=listener, limit=HEAD_MAX)
    hand_over.watch()
    users = os.open(os.path.join(state, layout.PROXY_USERS), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    async with server:
        while True:
            await asyncio.sleep(USERS_CHECK)
            try:
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a serve or a supervisor still needs us
            break  # nobody: stop (the exclusive lock keeps a newcomer waiting until we are gone)
    os.close(users)

"""The agent's internet proxy: HTTP CONNECT and plain HTTP on a Unix socket,
admitting only the hosts the sandbox file's [internet] names.

One per agent (`<state>/proxy.lock`), on `<state>/proxy/proxy.sock`, the one
folder of the state folder a sandbox sees (read-only, at /run/lnk/proxy).
It lives while a serve or a supervisor holds a shared lock on
`<state>/proxy.users`, and exits when none does.

asyncio, stdlib only: one thread serves every connection, so a slow client
costs a waiting coroutine, never a blocked worker, and a hundred connections
are a hundred small tasks.

A name is resolved once; the address checked is the address connected. A
target whose address is loopback, private, link-local or otherwise not
global is refused unless the list names it exactly (a name or an address):
the way in and the host's own services stay out of reach.
"""

from __future__ import annotations

import asyncio
import fcntl
import ipaddress
import os
import socket
import sys
import time

from .config import split_flags
from .errors import UsageError

HEAD_MAX = 64 * 1024
HEAD_TIMEOUT = 30.0
CONNECT_TIMEOUT = 10.0
CHUNK = 256 * 1024
USERS_CHECK = 1.0  # seconds between looks for a remaining user (no event exists for a flock's release)
SOCKET = "proxy.sock"


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


def public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class Proxy:
    def __init__(self, state: str, rules: Rules, route: tuple[str, int] | None):
        self.state, self.rules, self.route = state, rules, route
        self.refused_log = os.path.join(state, "proxy-refused.log")

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        try:
            await self.serve(head, reader, writer)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def serve(self, head: bytes, reader, writer):
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
        admitted, named = self.rules.admits(host, port)
        if not admitted:
            return await self.refuse(writer, host, port, "is not among the hosts it allows")
        try:
            upstream_reader, upstream_writer = await self.connect(host, port, named)
        except PermissionError as why:
            return await self.refuse(writer, host, port, str(why))
        except (TimeoutError, OSError) as problem:
            return await self.answer(writer, 502, "Bad Gateway", f"cannot reach {host}:{port}: {problem}")
        if method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
        else:
            upstream_writer.write(rest)
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    async def connect(self, host: str, port: int, named: bool):
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [info[4][0] for info in infos]
        allowed = [a for a in addresses if named or public(a)]
        if not allowed:
            raise PermissionError(f"resolves to {', '.join(sorted(set(addresses)))}, an address of this "
                                  "machine or its network, which only a host named in the list may reach")
        address = allowed[0]
        if self.route is None:
            return await asyncio.wait_for(asyncio.open_connection(address, port), CONNECT_TIMEOUT)
        # Through the agent's route: every admitted connection goes out there.
        r, w = await asyncio.wait_for(asyncio.open_connection(*self.route), CONNECT_TIMEOUT)
        target = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        w.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        reply = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), CONNECT_TIMEOUT)
        if reply.split(b" ", 2)[1:2] != [b"200"]:
            w.close()
            raise OSError(f"the route refused it ({reply.splitlines()[0].decode('latin-1')})")
        return r, w

    async def refuse(self, writer, host: str, port: int, why: str):
        with open(self.refused_log, "a") as f:
            f.write(f"{time.time():.3f} {host}:{port}\n")
        await self.answer(writer, 403, "Forbidden",
                          f"Link Run's proxy refused {host}:{port}: it {why}. The sandbox file's [internet] "
                          f"hosts allow: {self.rules.describe()} (without a port, only 80 and 443).")

    @staticmethod
    async def answer(writer, status: int, reason: str, text: str):
        body = (text + "\n").encode()
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


def refused_since(state: str, since: float) -> list[str]:
    """The hosts the proxy refused since `since` (unix seconds), each once, in order."""
    try:
        with open(os.path.join(state, "proxy-refused.log"), "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 256 * 1024))  # the tail is enough
            lines = f.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    seen: list[str] = []
    for line in lines:
        when, _, target = line.partition(" ")
        try:
            if float(when) >= since and target not in seen:
                seen.append(target)
        except ValueError:
            continue
    return seen


def _route(text: str | None) -> tuple[str, int] | None:
    if not text:
        return None
    if not text.startswith("http://") or ":" not in text[7:]:
        raise UsageError(f"--route {text!r} is not an HTTP proxy address", "give http://host:port")
    host, _, port = text[7:].rstrip("/").rpartition(":")
    if not port.isdigit():
        raise UsageError(f"--route {text!r} has no port", "give http://host:port")
    return host, int(port)


def main(argv: list[str]) -> int:
    flags, _ = split_flags(argv, {"--state", "--host", "--route"}, set(), {"--host"})
    if "--state" not in flags:
        raise UsageError("proxy needs --state <dir>", "it is started by serve and the supervisors, not by hand")
    state = os.path.abspath(str(flags["--state"]))
    rules = Rules(list(flags.get("--host", [])))  # type: ignore[arg-type]
    route = _route(flags.get("--route"))  # type: ignore[arg-type]
    lock = os.open(os.path.join(state, "proxy.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another proxy serves this agent
    folder = os.path.join(state, "proxy")
    os.makedirs(folder, mode=0o755, exist_ok=True)
    os.chmod(folder, 0o755)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    temporary = os.path.join(folder, f".{SOCKET}.{os.getpid()}")
    listener.bind(temporary)
    os.chmod(temporary, 0o666)  # the sandbox connects as whoever it maps to
    listener.listen(256)
    os.rename(temporary, os.path.join(folder, SOCKET))  # a restarted proxy replaces the socket whole
    print(f"lnk-link-run proxy: serving {folder}/{SOCKET}, hosts: {rules.describe()}", file=sys.stderr, flush=True)
    asyncio.run(_serve(Proxy(state, rules, route), listener, state))
    return 0


async def _serve(proxy: Proxy, listener: socket.socket, state: str):
    server = await asyncio.start_unix_server(proxy.handle, sock=listener, limit=HEAD_MAX)
    users = os.open(os.path.join(state, "proxy.users"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    async with server:
        while True:
            await asyncio.sleep(USERS_CHECK)
            try:
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a serve or a supervisor still needs us
            break  # nobody: stop (the exclusive lock keeps a newcomer waiting until we are gone)
    os.close(users)


def ensure_running(state: str, hosts: list[str], route: str | None = None, timeout: float = 5.0) -> int:
    """Count the caller among the proxy's users, and start the proxy if it is not
    running; returns the users descriptor (close-on-exec), to keep open for as
    long as the caller needs the proxy."""
    import subprocess

    users = os.open(os.path.join(state, "proxy.users"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(users, fcntl.LOCK_SH)
    lock = os.open(os.path.join(state, "proxy.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        running = False
    except BlockingIOError:
        running = True
    os.close(lock)  # released: the proxy we start takes it
    if not running:
        argv = [sys.executable, "-I", "-m", "linkrun", "proxy", "--state", state]
        for host in hosts:
            argv += ["--host", host]
        if route:
            argv += ["--route", route]
        log = os.open(os.path.join(state, "proxy.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            # Detached as the supervisors are: a shell puts it in the background and exits.
            subprocess.run(["/bin/sh", "-c", '"$@" &', "sh", *argv], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=log, start_new_session=True, check=True)
        finally:
            os.close(log)
    path = os.path.join(state, "proxy", SOCKET)
    deadline = time.monotonic() + timeout
    while True:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
            return users
        except OSError:
            if time.monotonic() > deadline:
                os.close(users)
                raise UsageError("the agent's proxy did not start", f"its log is {state}/proxy.log") from None
            time.sleep(0.01)  # no event tells when a socket starts listening
        finally:
            probe.close()

"""The agent's proxy, on loopback only: a real proxy process on a Unix socket,
and a test "internet" server on 127.0.0.2."""

from __future__ import annotations

import fcntl
import json
import os
import resource
import select
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import SERVER, clean_env, require_sandbox, wait_for

from linkrun.network import internet, peers, proxy, rules
from linkrun.state import layout
from linkrun.sandboxing import initpid


@pytest.fixture
def run_proxy(tmp_path):
    started = []

    def start(*hosts: str, nofile: tuple[int, int] | None = None, **env: str) -> str:
        """A proxy admitting `hosts`, its stderr in `<state>/proxy.log`, its
        environment `env`; with `nofile`, started under that descriptor limit (soft, hard)."""
        state = tmp_path / f"state{len(started)}"
        state.mkdir()
        users = os.open(state / "proxy.users", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(users, fcntl.LOCK_SH)  # a user, so it stays
        internet.write_settings(str(state), list(hosts), None)
        argv = SERVER + ["proxy", "--state", str(state)]
        limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile)) if nofile else None
        with open(state / "proxy.log", "wb") as log:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=log, env=clean_env(**env),
                                       preexec_fn=limit)
        started.append((process, users))
        sock = state / "proxy" / "proxy.sock"
        wait_for(lambda: connects(str(sock)), what="the proxy to listen")
        return str(state)

    yield start
    for process, users in started:
        os.close(users)
        process.wait(timeout=10)


def connects(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def ask(state: str, request: bytes, timeout=10.0) -> bytes:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout)
        sock.connect(os.path.join(state, "proxy", "proxy.sock"))
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        return data


def connect_waiting(state: str, timeout: float) -> socket.socket:
    """A connection to the proxy that waits up to `timeout` for room in its
    backlog, as a program's blocking connect does (a non-blocking one fails at once)."""
    sock = socket.socket(socket.AF_UNIX)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(timeout), 0))
    sock.connect(os.path.join(state, "proxy", "proxy.sock"))
    sock.settimeout(timeout)
    return sock


def tunnel_get(state: str, host: str, port: int, path: str = "/x", timeout=10.0) -> bytes:
    with connect_waiting(state, timeout) as sock:
        sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(4096)
            if not chunk:
                return reply
            reply += chunk
        if not reply.startswith(b"HTTP/1.1 200"):
            while chunk := sock.recv(4096):
                reply += chunk
            return reply
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        return data


def test_a_named_host_is_reached_through_connect_and_plain_http(site, run_proxy):
    state = run_proxy(f"127.0.0.2:{site}")
    assert tunnel_get(state, "127.0.0.2", site).endswith(b"hello from /x")
    plain = ask(state, f"GET http://127.0.0.2:{site}/plain HTTP/1.1\r\nHost: 127.0.0.2\r\n\r\n".encode())
    assert plain.startswith(b"HTTP/1.0 200") and plain.endswith(b"hello from /plain")


def test_a_host_not_named_gets_a_403_naming_the_allowed_hosts_and_is_recorded(site, run_proxy):
    state = run_proxy("example.org")
    since = time.time() - 1
    reply = tunnel_get(state, "127.0.0.2", site)
    assert reply.startswith(b"HTTP/1.1 403")
    assert b"127.0.0.2:" in reply and b"allow: example.org" in reply
    assert internet.proxy_log(state, since) == [(f"127.0.0.2:{site}", "")]  # refused: no reason of the host's
    assert internet.proxy_log(state, time.time() + 60) == []


def closed_port(address: str = "127.0.0.2") -> int:
    """A port on `address` where nothing listens: bound, then let go."""
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def test_an_allowed_host_that_cannot_be_reached_gets_a_502_saying_why_and_is_logged_apart(run_proxy):
    port = closed_port()
    state = run_proxy(f"127.0.0.2:{port}")
    since = time.time() - 1
    reply = tunnel_get(state, "127.0.0.2", port)
    assert reply.startswith(b"HTTP/1.1 502"), reply
    assert f"Link Run's proxy could not reach 127.0.0.2:{port}: the connection was refused".encode() in reply, reply
    # Allowed, so not a refusal: logged with why it was not reached.
    assert internet.proxy_log(state, since) == [(f"127.0.0.2:{port}", "the connection was refused (nothing listens "
                                                 "on that port)")]


def test_a_refusal_that_cannot_be_logged_still_gets_its_403_and_bad_requests_a_400(site, run_proxy):
    state = run_proxy("example.org")
    os.mkdir(os.path.join(state, layout.PROXY_REFUSED))  # the log cannot be written, as on a full disk
    assert tunnel_get(state, "127.0.0.2", site).startswith(b"HTTP/1.1 403")
    assert internet.proxy_log(state, 0) == []
    for request, says in ((b"NONSENSE\r\n\r\n", b"METHOD TARGET VERSION"),
                          (b"GET /relative HTTP/1.1\r\n\r\n", b"absolute http:// URL"),
                          (b"CONNECT example.org:https HTTP/1.1\r\n\r\n", b"cannot read a host and port")):
        reply = ask(state, request)
        assert reply.startswith(b"HTTP/1.1 400") and says in reply, reply
    assert tunnel_get(state, "no-such-host.invalid", 443).startswith(b"HTTP/1.1 403")  # not named: never looked up


def test_without_a_port_only_80_and_443_are_admitted(site, run_proxy):
    state = run_proxy("127.0.0.2")
    assert tunnel_get(state, "127.0.0.2", site).startswith(b"HTTP/1.1 403")


def test_star_refuses_loopback_and_a_name_resolving_to_it_unless_named(site, run_proxy):
    state = run_proxy("*")
    for host in ("127.0.0.2", "localhost"):
        reply = tunnel_get(state, host, 80)
        assert reply.startswith(b"HTTP/1.1 403"), reply
    assert b"not a public address" in tunnel_get(state, "localhost", 443)


# Each an address of this machine (127.0.0.1) or its network inside an IPv6
# one: where a NAT64, 6to4 or SIIT gateway exists, it would reach that IPv4.
EMBEDDED_PRIVATE = ("::7f00:1", "::ffff:7f00:1", "::ffff:0:7f00:1", "64:ff9b::7f00:1", "64:ff9b:1::a00:1",
                    "2002:7f00:1::1", "2002:a00:1::1", "fec0::1")


def test_star_refuses_an_ipv6_address_that_embeds_a_private_ipv4_without_trying_it(run_proxy):
    state = run_proxy("*")
    for address in EMBEDDED_PRIVATE:
        reply = tunnel_get(state, f"[{address}]", 80)
        assert reply.startswith(b"HTTP/1.1 403") and b"not a public address" in reply, (address, reply)
    assert internet.proxy_log(state, 0) == [(f"[{address}]:80", "") for address in EMBEDDED_PRIVATE]


def test_an_embedded_public_ipv4_is_public_and_a_site_local_or_local_nat64_address_is_not():
    for address in ("::5db8:d822", "::ffff:5db8:d822", "64:ff9b::5db8:d822", "2002:5db8:d822::1"):
        assert rules.public(address), address
    for address in (*EMBEDDED_PRIVATE, "64:ff9b:1::5db8:d822", "fec0:1::5db8:d822", "::", "2002::1"):
        assert not rules.public(address), address
    assert rules.public("2606:4700::1111")


def test_the_rules_match_exact_wildcard_and_port_entries():
    admitted = rules.Rules(["example.org", "*.example.net", "example.com:8443"])
    assert admitted.admits("example.org", 443) == (True, True)
    assert admitted.admits("EXAMPLE.org.", 80) == (True, True)
    assert admitted.admits("example.org", 8080) == (False, False)
    assert admitted.admits("a.example.net", 443) == (True, False)
    assert admitted.admits("example.net", 443) == (False, False)
    assert admitted.admits("example.com", 8443) == (True, True)
    assert admitted.admits("example.com", 443) == (False, False)
    assert rules.Rules(["*"]).admits("anything.example", 443) == (True, False)
    assert not rules.public("127.0.0.1") and not rules.public("10.1.2.3") and not rules.public("169.254.1.1")
    assert not rules.public("::ffff:192.168.1.1") and rules.public("93.184.216.34")


def test_a_hundred_concurrent_connections_are_all_served(site, run_proxy):
    state = run_proxy(f"127.0.0.2:{site}")
    results = [None] * 100

    def get(index):
        results[index] = tunnel_get(state, "127.0.0.2", site, f"/{index}")

    threads = [threading.Thread(target=get, args=(i,)) for i in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert all(r is not None and r.endswith(f"hello from /{i}".encode()) for i, r in enumerate(results))


def test_a_slow_client_does_not_stall_others(site, run_proxy):
    state = run_proxy(f"127.0.0.2:{site}")
    slow = socket.socket(socket.AF_UNIX)
    slow.connect(os.path.join(state, "proxy", "proxy.sock"))
    slow.sendall(b"CONNECT 127.0.0.2")  # and nothing more
    try:
        started = time.monotonic()
        assert tunnel_get(state, "127.0.0.2", site).endswith(b"hello from /x")
        assert time.monotonic() - started < 5
    finally:
        slow.close()


# A background command's many idle connections to the proxy, from a pid
# namespace of its own, as a sandbox's program is: it opens them all, says how
# many are connected, reads the proxy's answers until all but `admitted`
# have answered, and holds them open until it is killed.
HOG = r"""
import collections, json, selectors, socket, sys, time
path, count, admitted = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held = []
for _ in range(count):
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)  # blocking: on a full backlog, waits until the proxy accepts more
    held.append(sock)
print(len(held), flush=True)
waiting = selectors.DefaultSelector()
for sock in held:
    waiting.register(sock, selectors.EVENT_READ)
answers, sample = collections.Counter(), ""
deadline = time.monotonic() + 60
while sum(answers.values()) < len(held) - admitted and time.monotonic() < deadline:
    for key, _ in waiting.select(1):
        reply = key.fileobj.recv(65536).decode()
        waiting.unregister(key.fileobj)
        answers[reply.split(chr(13))[0]] += 1
        sample = reply or sample
print(json.dumps({"answers": answers, "sample": sample}), flush=True)
sys.stdin.read()
"""


def test_one_sandbox_holding_many_idle_connections_stalls_no_other(site, run_proxy):
    require_sandbox()
    descriptors = 512  # above the 256 the proxy may accept in one go, before any is answered
    state = run_proxy(f"127.0.0.2:{site}", nofile=(descriptors, descriptors))
    cap = proxy.sandbox_cap(descriptors)
    argv = ["bwrap", "--dev-bind", "/", "/", "--unshare-pid", "--die-with-parent", "--",
            sys.executable, "-c", HOG, os.path.join(state, "proxy", "proxy.sock"), "600", str(cap)]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as hog:
        try:
            connected = int(hog.stdout.readline())
            assert connected == 600  # more than the proxy's descriptors
            assert tunnel_get(state, "127.0.0.2", site, timeout=20).endswith(b"hello from /x")
            report = json.loads(hog.stdout.readline())
            assert report["answers"] == {"HTTP/1.1 503 Service Unavailable": connected - cap}, report
            assert f"holds {cap} connections" in report["sample"], report["sample"]
            log = Path(state, "proxy.log").read_text()
            assert log.count(f"holds {cap} connections") == 1, log  # once while it stays at the cap
        finally:
            hog.kill()


def test_a_pid_namespace_made_inside_a_sandbox_counts_as_that_sandbox(tmp_path):
    require_sandbox()
    path = str(tmp_path / "s")
    connect = f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({json.dumps(path)}); s.recv(1)"
    inner = f"bwrap --dev-bind / / --unshare-pid -- {sys.executable} -c '{connect}'"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen(2)
        listener.settimeout(20)
        argv = ["bwrap", "--dev-bind", "/", "/", "--unshare-pid", "--die-with-parent", "--",
                "/bin/sh", "-c", f"{sys.executable} -c '{connect}' & {inner}; wait"]
        with subprocess.Popen(argv) as sandbox:
            try:
                accepted = [listener.accept()[0] for _ in range(2)]
                pids = [struct.unpack("3i", p.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
                        for p in accepted]
                assert len({os.readlink(f"/proc/{pid}/ns/pid") for pid in pids}) == 2  # one nested in the other
                assert peers.sandbox_of(pids[0]) == peers.sandbox_of(pids[1]) != peers.sandbox_of(os.getpid())
                for peer in accepted:
                    peer.close()
                assert sandbox.wait(timeout=10) == 0
            finally:
                sandbox.kill()


def test_a_silent_connection_is_closed_after_the_head_timeout(site, run_proxy):
    state = run_proxy(f"127.0.0.2:{site}", LNK_PROXY_HEAD_TIMEOUT="1")
    with connect_waiting(state, 10) as silent:
        silent.sendall(b"CONNECT 127.0.0.2")  # and nothing more
        assert silent.recv(4096) == b""  # closed by the proxy, well before this socket's own 10 s


class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(4096):
            self.request.sendall(data)


def test_a_tunnel_idle_either_way_is_closed_and_a_busy_one_is_not(run_proxy):
    with socketserver.ThreadingTCPServer(("127.0.0.2", 0), Echo) as echo:
        threading.Thread(target=echo.serve_forever, daemon=True).start()
        port = echo.server_address[1]
        state = run_proxy(f"127.0.0.2:{port}", LNK_PROXY_IDLE_TIMEOUT="2")
        with connect_waiting(state, 20) as sock:
            sock.sendall(f"CONNECT 127.0.0.2:{port} HTTP/1.1\r\n\r\n".encode())
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            started = time.monotonic()
            while time.monotonic() - started < 4:  # twice the idle time, busy all along
                sock.sendall(b"ping")
                assert sock.recv(4096) == b"ping"
                time.sleep(0.2)
            assert sock.recv(4096) == b""  # then idle: closed
        echo.shutdown()


def test_the_proxy_raises_its_descriptor_limit_to_the_hard_one(run_proxy):
    state = run_proxy("example.org", nofile=(256, 1024))
    pid = internet._answers(internet.socket_path(state))
    limits = Path(f"/proc/{pid}/limits").read_text()
    assert [line.split()[3:5] for line in limits.splitlines() if line.startswith("Max open files")] == [["1024", "1024"]]


def test_one_proxy_serves_every_user_and_exits_after_the_last(tmp_path):
    state = str(tmp_path)
    internet.write_settings(state, ["example.org"], None)
    first, second = internet.Users(state), internet.Users(state)
    first.ensure()
    second.ensure()
    lock = os.open(os.path.join(state, "proxy.lock"), os.O_RDWR)

    def running() -> bool:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(lock, fcntl.LOCK_UN)
        return False

    try:
        assert running()
        first.close()
        assert running()
        second.close()
        wait_for(lambda: not running(), timeout=10, what="the proxy to exit after its last user")
    finally:
        os.close(lock)


def test_a_killed_proxy_is_started_again_at_the_next_ensure(tmp_path, site):
    state = str(tmp_path)
    internet.write_settings(state, [f"127.0.0.2:{site}"], None)
    user = internet.Users(state)
    try:
        user.ensure()
        first = internet._answers(internet.socket_path(state))
        user.ensure()  # alive: nothing to do
        assert internet._answers(internet.socket_path(state)) == first
        gone = os.pidfd_open(first)
        try:
            signal.pidfd_send_signal(gone, signal.SIGKILL)
            # Until it has exited, as ensure sees it (its pidfd), not until its
            # socket refuses: a dying process's files close before it exits.
            assert select.select([gone], [], [], 10)[0], "the killed proxy did not exit"
        finally:
            os.close(gone)
        user.ensure()
        second = internet._answers(internet.socket_path(state))
        assert second not in (None, first)
        assert tunnel_get(state, "127.0.0.2", site).endswith(b"hello from /x")
    finally:
        user.close()


def run_in_held_sandbox(proxy_dir: str, program: list[str]) -> tuple[str, str | None]:
    """`program` run in a bare bwrap with a network of its own, started once the
    proxy at `proxy_dir` was handed its init: its output, and why it had no internet (or None)."""
    info_r, info_w = os.pipe2(os.O_CLOEXEC)
    block_r, block_w = os.pipe2(os.O_CLOEXEC)
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "--die-with-parent",
            "--info-fd", str(info_w), "--block-fd", str(block_r), "--", *program]
    process = subprocess.Popen(argv, pass_fds=(info_w, block_r), stdout=subprocess.PIPE, text=True)
    os.close(info_w)
    os.close(block_r)
    try:
        try:
            pidfd, pid = initpid.init_pidfd(info_r)
            assert pidfd is not None and pid is not None
            why = internet.hand_over(proxy_dir, pidfd, pid)
            os.close(pidfd)
        finally:
            os.close(block_w)
        return process.communicate(timeout=30)[0], why
    finally:
        process.kill()
        process.communicate()
        os.close(info_r)  # only now: bwrap writes more after the pid, and would die of SIGPIPE without a reader


FETCH = ("import socket, sys\ns = socket.create_connection(('127.0.0.1', 3128))\n"
         "s.sendall(f'GET http://127.0.0.2:{sys.argv[1]}/inside HTTP/1.0\\r\\n\\r\\n'.encode())\n"
         "print(s.makefile('rb').read().decode().split('\\r\\n')[0])")


def sockets_and_pidfds(pid: int) -> set[str]:
    """What the process holds of sockets and pidfds (a call's listener, its sandbox's init)."""
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        if target.startswith("socket:") or target == "anon_inode:[pidfd]":
            held.add(target)
    return held


def test_a_sandbox_handed_over_reaches_the_proxy_on_its_own_loopback_until_it_ends(site, run_proxy):
    require_sandbox()
    state = run_proxy(f"127.0.0.2:{site}")
    pid = internet._answers(internet.socket_path(state))
    assert ask(state, b"NONSENSE\r\n\r\n").startswith(b"HTTP/1.1 400")  # its loop runs: what it holds for good
    before = sockets_and_pidfds(pid)
    output, why = run_in_held_sandbox(os.path.join(state, "proxy"), [sys.executable, "-I", "-c", FETCH, str(site)])
    assert why is None
    assert output == "HTTP/1.0 200 OK\n"
    wait_for(lambda: sockets_and_pidfds(pid) == before, what="the proxy to close the sandbox's listener")


def test_a_process_without_a_network_of_its_own_is_refused_and_the_caller_told_why(tmp_path, run_proxy):
    state = run_proxy("example.org")
    with subprocess.Popen(["sleep", "60"]) as plain:
        pidfd = os.pidfd_open(plain.pid)
        try:
            why = internet.hand_over(os.path.join(state, "proxy"), pidfd, plain.pid)
        finally:
            os.close(pidfd)
            plain.kill()
    assert why == "the agent's proxy cannot listen in the sandbox: [Errno 22] the process handed over has no " \
        "network of its own", why
    gone = internet.hand_over(str(tmp_path / "nowhere"), 0, 1)
    assert gone is not None and gone.startswith("the agent's proxy cannot be reached"), gone


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(child) for child in f.read().split()]


def handover_process(proxy_pid: int) -> int | None:
    """The proxy's one live child: its hand-over process, once it runs."""
    for child in children(proxy_pid):
        try:
            if Path(f"/proc/{child}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
                return child
        except FileNotFoundError:
            continue
    return None


def proxy_and_hand_over(run_proxy, site: int) -> tuple[str, int, int]:
    """A proxy admitting the site: its state folder, its pid, and its hand-over process's once that runs."""
    state = run_proxy(f"127.0.0.2:{site}")
    pid = internet._answers(internet.socket_path(state))
    assert pid is not None
    return state, pid, wait_for(lambda: handover_process(pid), what="the hand-over process to start")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_hand_over_process_that_died_is_started_again_and_the_proxy_does_not_spin(site, run_proxy):
    require_sandbox()
    state, pid, first = proxy_and_hand_over(run_proxy, site)
    os.kill(first, signal.SIGKILL)
    second = wait_for(lambda: handover_process(pid) not in (None, first) and handover_process(pid),
                      timeout=15, what="another hand-over process")
    assert second != first
    output, why = run_in_held_sandbox(os.path.join(state, "proxy"), [sys.executable, "-I", "-c", FETCH, str(site)])
    assert why is None, why
    assert output == "HTTP/1.0 200 OK\n"
    before = cpu_seconds(pid)
    time.sleep(1)  # what an idle proxy spends in a second, against a spinning one's
    assert cpu_seconds(pid) - before < 0.3, "the proxy spins"
    assert "the hand-over process ended" in Path(state, "proxy.log").read_text()


def test_as_root_a_hand_over_forks_nothing_and_leaves_nothing_of_the_sandbox_in_the_hand_over_process(site, run_proxy):
    # Root may join a network from where it is: no process per call, and back home after each.
    require_sandbox()
    if os.geteuid() != 0:
        pytest.skip("as an ordinary user, each hand-over takes a spare process (test_internet covers it)")
    state, pid, hands = proxy_and_hand_over(run_proxy, site)
    before = sockets_and_pidfds(hands)
    for _ in range(3):
        output, why = run_in_held_sandbox(os.path.join(state, "proxy"), [sys.executable, "-I", "-c", FETCH, str(site)])
        assert why is None, why
        assert output == "HTTP/1.0 200 OK\n"
    assert handover_process(pid) == hands and children(hands) == [], "a process forked for a hand-over"
    assert os.readlink(f"/proc/{hands}/ns/net") == os.readlink("/proc/self/ns/net"), "left in a sandbox's network"
    assert sockets_and_pidfds(hands) == before, "a listener or a pidfd kept"


def test_the_hand_over_script_imports_nothing_but_the_standard_library():
    # It runs as `python -I -S handover.py`, and stays small so that its forks are cheap.
    import ast

    tree = ast.parse(Path(proxy.__file__).with_name("handover.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    assert not any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(tree))
    assert imported <= {"collections", "ctypes", "errno", "os", "signal", "socket", "sys"}, imported


def test_a_caller_that_leaves_before_its_answer_leaves_the_hand_over_process_serving(site, run_proxy):
    # serve killed mid-call closes its end first: the next call must find the hand-over as it was.
    require_sandbox()
    state, pid, hands = proxy_and_hand_over(run_proxy, site)
    with subprocess.Popen(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-all", "--die-with-parent",
                           "--", "sleep", "60"]) as sandbox:
        init = wait_for(lambda: children(sandbox.pid) and children(sandbox.pid)[0], what="the sandbox's init")
        pidfd = os.pidfd_open(init)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as leaving:
                leaving.connect(os.path.join(state, "proxy", "hand.sock"))
                socket.send_fds(leaving, [b"%d" % init], [pidfd])
        finally:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # its namespace with it: bwrap then ends
            os.close(pidfd)
    output, why = run_in_held_sandbox(os.path.join(state, "proxy"), [sys.executable, "-I", "-c", FETCH, str(site)])
    assert why is None, why
    assert output == "HTTP/1.0 200 OK\n"
    assert handover_process(pid) == hands, "the hand-over process ended"

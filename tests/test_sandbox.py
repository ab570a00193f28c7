"""The bubblewrap sandbox (DESIGN.md §6, §8): the sandbox file, the fixed argv
read as data, and each guarantee proved with real bubblewrap and real
programs through `lnk-link-run sandbox`, which runs exactly what a call runs.

Every agent folder, home and state folder lives under tmp_path. These tests
run as root here: each guarantee below holds for root too (the sandbox drops
every capability), and the tests prove it so.
"""

from __future__ import annotations

import re
import os
import secrets
import subprocess
from pathlib import Path

import pytest
from conftest import SERVER, require_sandbox, wait_for
from up_harness import processes_with
from sandbox_helpers import Agent

from linkrun import agent
from linkrun.sandboxing import hostfacts, sandbox, sandboxfile
from linkrun.errors import LinkRunError


@pytest.fixture
def box(tmp_path) -> Agent:
    require_sandbox()
    return Agent(tmp_path, '[files]\nwrite = ["data"]\n')


def fake_host(**changes) -> sandbox.Host:
    facts = dict(bwrap="/usr/bin/bwrap", prlimit="/usr/bin/prlimit", disable_userns=True,
                 root=(("/bin", "usr/bin"), ("/lib", "usr/lib")), nproc=5000, fsize_max=None)
    facts.update(changes)
    return sandbox.Host(**facts)


# The sandbox file.

def test_a_write_entry_must_be_a_relative_folder_outside_chats_and_background():
    for bad in (["/abs"], [".."], ["a/../b"], ["a//b"], ["."], [""], ["chats"], ["chats/x"],
                ["background"], ["background/x"], ["a", "a/b"]):
        with pytest.raises(LinkRunError):
            sandboxfile.check_write(bad, "test")
    assert sandboxfile.check_write(["data", "work/cache", "out/reports"], "test") == ("data", "work/cache", "out/reports")


def test_an_unknown_section_or_key_is_refused():
    with pytest.raises(LinkRunError, match=r"unknown section \[command\]"):
        sandboxfile.parse({"command": {"allow": ["sh"]}}, "f")
    with pytest.raises(LinkRunError, match="unknown key 'writes'"):
        sandboxfile.parse({"files": {"writes": ["x"]}}, "f")


def test_internet_hosts_are_names_wildcards_and_ports_or_star():
    good = ["example.org", "*.example.net", "api.example.com:8443", "127.0.0.2:8000", "localhost:5432", "*"]
    assert sandboxfile.parse({"internet": {"hosts": good}}, "f").hosts == tuple(good)
    for bad in ("http://example.org", "example.org/path", "example.org:0", "example.org:70000", "*:80",
                "ex ample.org", "", "[::1]:80", "*.*.example.org"):
        with pytest.raises(LinkRunError, match=r"\[internet\] hosts has"):
            sandboxfile.parse({"internet": {"hosts": [bad]}}, "f")
    # A third new user's trial: the refusal gave the right form, and never said what was wrong.
    for bad, why in (("https://pypi.org", "with a scheme: a host is its name alone"),
                     ("pypi.org/simple", "with a path: a host is its name alone"),
                     ("pypi.org:99999", "whose port 99999 is not one (1 to 65535)"),
                     ("*:80", "a port for *, which admits 80 and 443 alone")):
        with pytest.raises(LinkRunError, match=re.escape(f"[internet] hosts has {bad!r}, {why}")):
            sandboxfile.parse({"internet": {"hosts": [bad]}}, "f")


def test_every_mistake_of_a_sandbox_file_is_said_at_once():
    # Two trials: a file with two mistakes was refused for one, mended, then refused for the next.
    data = {"limits": {"memory": "4 GB", "tmp": "lots"}, "internet": {"hosts": "pypi.org"}, "bogus": {},
            "files": {"wirte": ["data"]}}
    with pytest.raises(LinkRunError) as refused:
        sandboxfile.parse(data, "f")
    message = refused.value.message
    assert message.startswith("f has 5 mistakes: "), message
    for said in ("unknown section [bogus]", "unknown key 'wirte' in [files]", "[internet] hosts is not a list",
                 "[limits] tmp 'lots' is not a size", "[limits] memory '4 GB' is not a size"):
        assert said in message, message
    assert refused.value.hint == "mend each"
    with pytest.raises(LinkRunError) as alone:  # one alone, as it was
        sandboxfile.parse({"bogus": {}}, "f")
    assert alone.value.message == "f: unknown section [bogus]", alone.value.message


def test_a_section_left_out_takes_the_embedded_default():
    parsed = sandboxfile.parse({"files": {"write": ["data"]}}, "f")
    assert "sh" in parsed.allow and "python3" in parsed.allow
    assert parsed.write == ("data",)
    assert sandboxfile.parse({"commands": {"allow": []}}, "f").allow == ()
    limited = sandboxfile.parse({"limits": {"tmp": "1M", "file": 4096}}, "f")
    assert (limited.tmp_size, limited.file_size) == (1024 * 1024, 4096)


# The fixed argv, read as data.

def test_the_fixed_argv_has_the_limits_namespaces_and_read_only_system(tmp_path):
    folder = agent.create(str(tmp_path / "a"))
    argv = sandbox.fixed_argv(folder, sandboxfile.load(None), fake_host(), [], [])
    assert argv[:5] == ["/usr/bin/prlimit", "--core=0", f"--fsize={4 * 1024**3}", "--nproc=5000", "--"]
    assert argv[5] == "/usr/bin/bwrap"
    for flag in ("--unshare-user", "--disable-userns", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                 "--unshare-cgroup", "--unshare-net", "--die-with-parent", "--new-session", "--clearenv"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    text = " ".join(argv)
    assert "--ro-bind /usr /usr" in text and "--symlink usr/bin /bin" in text
    assert "--proc /proc" in text and "--dev /dev" in text
    assert f"--size {1024**3} --tmpfs /tmp" in text
    for path in (folder.files, folder.agent, folder.home):
        assert f"--ro-bind {path} {path}" in text
    # Of the state folder, only the /etc view's link, bound as /etc (a launch pins the view it names).
    assert f"--ro-bind {folder.state}/etc.view /etc" in text
    assert folder.config not in text and folder.state not in text.replace(f"{folder.state}/etc.view /etc", "")
    assert "--bind " not in text  # the write folders come per call, by descriptor
    assert argv[-1] != "--"  # serve appends the per-call part, then the --


def test_the_fixed_argv_leaves_out_disable_userns_where_bwrap_has_none(tmp_path):
    argv = sandbox.fixed_argv(agent.create(str(tmp_path / "a")), sandboxfile.load(None),
                              fake_host(disable_userns=False), [], [])
    assert "--disable-userns" not in argv and "--unshare-user" in argv


def test_what_bwrap_takes_is_read_in_its_file_as_its_help_says_it_and_a_wrapper_is_asked(tmp_path):
    require_sandbox()
    bwrap = sandbox.find_system("bwrap")
    assert bwrap is not None
    said = "--disable-userns" in subprocess.run([bwrap, "--help"], capture_output=True, text=True).stdout
    assert hostfacts.bwrap_has(bwrap, "--disable-userns") is said
    assert hostfacts.bwrap_has(bwrap, "--no-such-option") is False
    wrapper = tmp_path / "bwrap"  # a wrapper names no option: its --help (the real bwrap's) is asked
    wrapper.write_text(f'#!/bin/sh\nexec {bwrap} "$@"\n')
    wrapper.chmod(0o755)
    assert hostfacts.bwrap_has(str(wrapper), "--disable-userns") is said


def test_the_file_size_limit_never_exceeds_the_hard_limit(tmp_path):
    argv = sandbox.fixed_argv(agent.create(str(tmp_path / "a")), sandboxfile.load(None), fake_host(fsize_max=1000), [], [])
    assert "--fsize=1000" in argv


def test_the_environment_is_its_own_with_caches_under_work(tmp_path):
    folder = agent.create(str(tmp_path / "a"))
    env = dict(sandbox.environment(folder))
    assert set(env) == {"PATH", "HOME", "LANG", "TMPDIR", "NO_COLOR", "TERM", "PAGER", "GIT_TERMINAL_PROMPT",
                        "PYTHONUNBUFFERED", "NODE_REPL_HISTORY", "XDG_CACHE_HOME", "PIP_CACHE_DIR", "npm_config_cache", "CARGO_HOME", "GOCACHE", "GOPATH",
                        "PIP_RETRIES", "npm_config_fetch_retries", "CARGO_NET_RETRY"}
    # With the internet, the package managers keep their retries; the proxy's variables name it.
    through_proxy = dict(sandbox.environment(folder, internet=True))
    assert not {"PIP_RETRIES", "npm_config_fetch_retries", "CARGO_NET_RETRY"} & set(through_proxy)
    assert "HTTPS_PROXY" in through_proxy
    assert env["HOME"] == folder.home and env["PATH"] == sandbox.SYSTEM_PATH
    for name in ("XDG_CACHE_HOME", "PIP_CACHE_DIR", "npm_config_cache", "CARGO_HOME", "GOCACHE", "GOPATH"):
        assert env[name].startswith(f"{folder.files}/work/.cache")


def test_the_builder_refuses_a_bind_containing_or_inside_a_protected_place(tmp_path):
    box = Agent(tmp_path)
    folder = box.folder
    places = agent.protected(folder, str(box.keyring), box.env)
    what = dict((path, w) for path, w in places)
    assert what[str(tmp_path / "agents" / "other")].startswith("another agent's folder")
    assert str(box.user_home / ".ssh") in what and str(box.keyring) in what and folder.state in what
    with pytest.raises(LinkRunError, match="lies inside your ~/.ssh"):
        sandbox.fixed_argv(folder, sandboxfile.load(None), fake_host(), [str(box.user_home / ".ssh" / "bin")], places)
    with pytest.raises(LinkRunError, match="contains the keyring"):
        sandbox.fixed_argv(folder, sandboxfile.load(None), fake_host(), [str(box.user_home)], places)
    with pytest.raises(LinkRunError, match="another agent's folder"):
        sandbox.fixed_argv(folder, sandboxfile.load(None), fake_host(), [str(tmp_path / "agents" / "other" / "bin")], places)
    # A keyring kept inside the files folder would be shown: refused.
    inside = agent.protected(folder, f"{folder.files}/keys", box.env)
    with pytest.raises(LinkRunError, match="contains the keyring"):
        sandbox.fixed_argv(folder, sandboxfile.load(None), fake_host(), [], inside)


def test_programs_kept_are_those_this_machine_has(tmp_path):
    folder = agent.create(str(tmp_path / "a"))
    tool = tmp_path / "opt" / "bin" / "tool"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    kept = sandbox.programs(["sh", "no-such-program-here", str(tool), "/no/such/tool", "*"],
                            sandbox.host_facts(), folder)
    assert kept.kept == ("sh", str(tool), "*")
    assert kept.missing == ("no-such-program-here", "/no/such/tool")
    assert kept.folders == (str(tool.parent),)


# The guarantees, with real bubblewrap.

def test_cannot_write_outside_the_write_folders(box):
    done = box.sh(
        "echo w > work/w && echo d > data/d && echo t > /tmp/t && echo ok; "
        "for p in x work/../x ../Home/x ../Agent/x /usr/x /etc/x /x /proc/x; do "
        "  (: > $p) 2>/dev/null && echo WROTE $p; done; "
        # The folders above the files folder are the sandbox's own (made by
        # bwrap), never the host's: what a program makes there is gone.
        "mkdir ../../escape 2>/dev/null; true")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok"]
    assert (box.files / "work" / "w").read_text() == "w\n"
    assert (box.files / "data" / "d").read_text() == "d\n"
    assert sorted(os.listdir(box.files)) == ["background", "chats", "data", "work"]
    assert sorted(os.listdir(box.root / "Home")) == ["note"]
    assert not (box.tmp / "agents" / "escape").exists()


def test_cannot_write_chats_or_background(box):
    (box.files / "chats" / "c").write_text("chat\n")
    done = box.sh("for p in chats/x chats/c background/x.out; do (echo no > $p) 2>/dev/null && echo WROTE $p; done; "
                  "rm -f chats/c 2>/dev/null && echo REMOVED; mv chats chats2 2>/dev/null && echo MOVED; "
                  "cat chats/c")
    assert done.stdout == "chat\n", done.stdout + done.stderr
    assert os.listdir(box.files / "background") == []


def test_cannot_remount_a_read_only_path_writable_even_as_root(box):
    # As root, bwrap would keep every capability in the sandbox's user
    # namespace, enough for this remount: the sandbox drops them all.
    done = box.sh(f"mount -o remount,rw,bind {box.files} 2>/dev/null && echo REMOUNTED; "
                  "mount -t tmpfs none /mnt 2>/dev/null && echo MOUNTED; "
                  "unshare -Ur true 2>/dev/null && echo NEW-USERNS; "
                  "grep CapEff /proc/self/status")
    assert done.stdout.split() == ["CapEff:", "0000000000000000"], done.stdout


def test_cannot_read_the_state_folder_the_keyring_or_the_users_home(box):
    paths = [box.root / "State" / "record.json", box.keyring / "main.key", box.user_home / ".ssh" / "id_ed25519",
             box.user_home, box.root / "Config", box.tmp / "agents" / "other" / "Files" / "work" / "theirs",
             Path("/etc/shadow"), Path("/root")]
    done = box.run("sh", "-c", "for p in \"$@\"; do ls \"$p\" >/dev/null 2>&1 && echo SEEN \"$p\"; done; "
                "cat ../Home/note ../Agent/instructions.md", "sh", *[str(p) for p in paths])
    assert done.stdout == "home note\nbe kind\n", done.stdout + done.stderr
    assert "secret" not in done.stdout


def test_cannot_see_the_hosts_processes(box):
    done = box.sh("ls /proc | grep -E '^[0-9]+$'")
    pids = [int(p) for p in done.stdout.split()]
    assert os.getpid() not in pids
    assert len(pids) <= 4 and 1 in pids  # bwrap's pid 1, the shell, ls, grep


def test_no_network_but_loopback(box):
    script = """
import socket
print(sorted(name for _, name in socket.if_nameindex()))
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    print("REACHED")
except OSError as error:
    print("unreachable")
server = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(server.getsockname())
peer, _ = server.accept()
client.sendall(b"hi")
print(peer.recv(2).decode())
"""
    done = box.run("python3", "-c", script)
    assert done.stdout.split("\n")[:3] == ["['lo']", "unreachable", "hi"], done.stdout + done.stderr


def test_no_caller_variable_leaks_in(box):
    env = dict(box.env, SECRET_TOKEN="leaked", DISPLAY=":0", SSH_AUTH_SOCK="/tmp/agent.sock")
    done = box.run("env", env=env)
    names = {line.split("=", 1)[0] for line in done.stdout.splitlines()}
    assert names <= {name for name, _ in sandbox.environment(box.folder)} | {"PWD"}, names
    assert "leaked" not in done.stdout and "SSH_AUTH_SOCK" not in names


def test_a_server_started_in_one_call_is_gone_at_the_next(box):
    marker = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**6)}"
    serve = (
        "import socket, subprocess, sys\n"
        "s = socket.create_server(('127.0.0.1', 8765))\n"
        f"subprocess.Popen(['sleep', '{marker}'], pass_fds=[s.fileno()], start_new_session=True)\n"
        "print('listening')\n")
    first = box.run("python3", "-c", serve)
    assert first.stdout == "listening\n", first.stderr
    wait_for(lambda: not processes_with(marker), timeout=5, what="the first call's leftovers to die")
    second = box.run("python3", "-c", "import socket\ntry:\n socket.create_connection(('127.0.0.1', 8765), timeout=2)\n"
                     " print('REACHED')\nexcept OSError:\n print('refused')")
    assert second.stdout == "refused\n"


def test_a_process_left_in_the_background_of_a_call_does_not_outlive_it(box):
    marker = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**6)}"
    done = box.sh(f"sleep {marker} & setsid sleep {marker} & nohup sleep {marker} >/dev/null 2>&1 & echo left")
    assert done.stdout == "left\n"
    # The call's pid namespace died with its program: nothing of it is left.
    wait_for(lambda: not processes_with(marker), timeout=5, what="the background sleeps to die")


def test_tmp_is_limited_in_size(tmp_path):
    require_sandbox()
    box = Agent(tmp_path, '[limits]\ntmp = "1M"\n')
    done = box.sh("head -c 2000000 /dev/zero > /tmp/big; echo $?; wc -c < /tmp/big")
    status, size = done.stdout.split()
    assert status != "0" and int(size) <= 1024 * 1024
    assert "No space left" in done.stderr


def test_file_size_is_limited(tmp_path):
    require_sandbox()
    box = Agent(tmp_path, '[limits]\nfile = "1M"\n')
    done = box.sh("head -c 2000000 /dev/zero > work/big; echo $?")
    assert done.stdout.strip() == str(128 + 25)  # SIGXFSZ
    assert (box.files / "work" / "big").stat().st_size == 1024 * 1024


def test_a_fork_flood_is_contained(box):
    # As root, RLIMIT_NPROC binds nothing (the kernel exempts uid 0), so this
    # proves what holds for every user: the flood's processes live in the
    # call's pid namespace and all die with it, whatever they did (setsid,
    # double fork). For an ordinary user, --nproc also stops the flood itself;
    # the limit is checked to be in place.
    marker = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**6)}"
    done = box.sh(f"i=0; while [ $i -lt 200 ]; do (setsid sleep {marker} &) ; i=$((i+1)); done; "
                  "ls /proc | grep -cE '^[0-9]+$'; grep 'Max processes' /proc/self/limits")
    count, limits = done.stdout.split("\n", 1)
    assert int(count) >= 200
    nproc = int(limits.split()[2])
    assert nproc >= 4096 and limits.split()[2] == limits.split()[3]
    wait_for(lambda: not processes_with(marker), timeout=10, what="the flood to die with the call")


def test_a_sandbox_runs_in_the_files_folder_and_prints_its_argv(box):
    done = box.run("pwd")
    assert done.stdout == f"{box.files}\n"
    printed = subprocess.run(SERVER + ["sandbox", "--file", str(box.file), "--agent", str(box.root), "--print",
                                       "--", "sh"], env=box.env, capture_output=True, text=True, check=True)
    assert printed.stdout.startswith("/usr/bin/prlimit --core=0 ")
    assert f"--chdir {box.files} --seccomp " in printed.stdout
    assert printed.stdout.endswith(" -- /usr/bin/sh\n")
    assert f" {box.files}/data " in printed.stdout and f" {box.files}/work " in printed.stdout


def test_a_sandbox_file_that_is_not_toml_names_where_its_form_is_shown(tmp_path):
    bad = tmp_path / "sandbox.toml"
    bad.write_text("[commands\nallow = [sh]\n")
    with pytest.raises(LinkRunError) as refused:
        sandboxfile.load(str(bad))
    assert refused.value.message.startswith(f"the sandbox file {bad} is not valid TOML")
    assert "README's \"Use it from an MCP client\"" in refused.value.hint and "Config/sandbox.toml" in refused.value.hint

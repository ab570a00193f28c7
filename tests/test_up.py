"""`up` and `doctor` (DESIGN.md §6): what up hands serve, that it fails closed
in one line naming the fix, and a working sandboxed server out of the box."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SERVER, clean_env, require_sandbox, text_of
from sandbox_helpers import Agent, outer_sandbox

from linkrun import up
from linkrun.sandboxing import probe, sandbox, sandboxfile
from linkrun.errors import LinkRunError, UsageError


@pytest.fixture
def box(tmp_path) -> Agent:
    require_sandbox()
    return Agent(tmp_path)


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


def serve_part(argv: list[str]) -> list[str]:
    assert argv[:5] == [sys.executable, "-I", "-m", "linkrun", "serve"]
    return argv[:argv.index("--")]


def test_up_hands_serve_every_flag_with_the_products_defaults(box):
    argv = up.plan(["--agent", str(box.root), "--no-way-in"], box.env)
    serve = serve_part(argv)
    assert flag_values(serve, "--files") == [str(box.files)]
    assert flag_values(serve, "--programs-path") == [sandbox.SYSTEM_PATH]
    assert [flag_values(serve, f)[0] for f in ("--timeout", "--output", "--background", "--background-timeout",
                                               "--background-output", "--background-keep",
                                               "--background-per-day", "--hops")] == [
        "2m", "16K", "4", "1h", "16M", "1d", "100", "4"]
    assert flag_values(serve, "--state") == [str(box.root / "State")] and "--no-way-in" in serve
    assert flag_values(serve, "--write") == ["work"]
    assert flag_values(serve, "--checks") == [str(box.root)]  # serve checks the sandbox, after its first answer
    assert "sh" in flag_values(serve, "--program") and "python3" in flag_values(serve, "--program")
    fixed = argv[argv.index("--") + 1:]
    assert fixed[0].endswith("/prlimit") and "--unshare-net" in fixed
    # The state folder is serve's, never the sandbox's.
    assert str(box.root / "State") not in fixed


def test_up_without_a_way_in_offers_no_background_commands(box):
    serve = serve_part(up.plan(["--agent", str(box.root)], box.env))
    for flag in ("--background", "--way-in", "--no-way-in", "--hops"):
        assert flag not in serve
    # The state folder all the same: a call's cut output is kept there.
    at = serve.index("--state")
    assert serve[at + 1] == str(box.root / "State")
    assert serve[serve.index("--keep-output") + 1] == "16M"
    assert serve[serve.index("--keep-for") + 1] == "1d"
    assert serve[serve.index("--keep-total") + 1] == "256M"


def test_up_with_a_way_in_passes_it_the_agent_and_the_keyring(box):
    serve = serve_part(up.plan(["--agent", str(box.root), "--way-in", "http://127.0.0.1:4000/in", "--as", "main",
                                "--keyring", str(box.keyring)], box.env))
    assert flag_values(serve, "--way-in") == ["http://127.0.0.1:4000/in"]
    assert flag_values(serve, "--as") == ["main"] and flag_values(serve, "--keyring") == [str(box.keyring)]
    assert flag_values(serve, "--state") == [str(box.root / "State")]


def test_up_keeps_the_users_sandbox_file_and_spec_and_follows_them(box, tmp_path):
    box.file.write_text('[commands]\nallow = ["sh", "no-such-program-here"]\n[files]\nwrite = ["data"]\n')
    spec = tmp_path / "spec.toml"
    spec.write_text('[agent]\nname = "main"\n[tool.run]\ntimeout = "30s"\noutput = 65536\nbackground = 0\n')
    argv = up.plan(["--agent", str(box.root), "--sandbox", str(box.file), "--spec", str(spec), "--no-way-in"], box.env)
    serve = serve_part(argv)
    assert (box.root / "Config" / "sandbox.toml").read_text() == box.file.read_text()
    assert (box.root / "Config" / "spec.toml").read_text() == spec.read_text()
    assert flag_values(serve, "--program") == ["sh"]  # what this machine has
    assert flag_values(serve, "--missing-program") == ["no-such-program-here"]  # refused as missing, not as not allowed
    assert flag_values(serve, "--write") == ["work", "data"]
    assert (flag_values(serve, "--timeout"), flag_values(serve, "--output"), flag_values(serve, "--background")) == (
        ["30s"], ["65536"], ["0"])
    # The next start, with no arguments, keeps them.
    again = serve_part(up.plan(["--agent", str(box.root)], box.env))
    assert flag_values(again, "--program") == ["sh"] and flag_values(again, "--timeout") == ["30s"]


def test_up_with_an_empty_allow_list_passes_no_program(box):
    box.file.write_text("[commands]\nallow = []\n")
    serve = serve_part(up.plan(["--agent", str(box.root), "--sandbox", str(box.file)], box.env))
    assert "--program" not in serve


def test_an_allowed_absolute_program_under_tmp_runs_and_one_in_tmp_itself_is_refused(box, tmp_path, servers):
    tool = tmp_path / "tools" / "bin" / "hello"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\necho hello from a tool\n")
    tool.chmod(0o755)
    box.file.write_text(f'[commands]\nallow = ["{tool}"]\n')
    server = servers(SERVER + ["up", "--agent", str(box.root), "--sandbox", str(box.file)], env=box.env)
    server.initialize()
    assert "hello from a tool" in text_of(server.call("command", {"program": str(tool)}))
    assert server.close() == 0
    # A program in /tmp itself would bind the host's /tmp over the sandbox's own.
    in_tmp = Path("/tmp", f"lnk-tool-{os.getpid()}-{tmp_path.name}")
    in_tmp.write_text("#!/bin/sh\n")
    in_tmp.chmod(0o755)
    try:
        box.file.write_text(f'[commands]\nallow = ["{in_tmp}"]\n')
        with pytest.raises(LinkRunError, match="which would cover the sandbox's own /tmp"):
            up.plan(["--agent", str(box.root), "--sandbox", str(box.file)], box.env)
    finally:
        in_tmp.unlink()


def test_a_call_of_an_allowed_program_this_machine_lacks_says_so_and_a_refusal_says_how_to_allow_more(box, servers):
    box.file.write_text('[commands]\nallow = ["sh", "lnk-no-such-program"]\n')
    server = servers(SERVER + ["up", "--agent", str(box.root), "--sandbox", str(box.file)], env=box.env)
    server.initialize()
    lacking = text_of(server.call("command", {"program": "lnk-no-such-program"}))
    assert "program 'lnk-no-such-program' is allowed, but not found on this machine" in lacking, lacking
    assert "install it" in lacking and "or run another" in lacking and "allowed: sh" in lacking, lacking
    sandbox_file = os.path.join(os.path.realpath(box.root), "Config", "sandbox.toml")
    for program in ("cat", "/bin/cat"):
        refused = text_of(server.call("command", {"program": program}))
        assert "is not allowed" in refused and "allowed: sh" in refused, refused
        assert f"to allow more, add it to [commands] allow in {sandbox_file}, then start the agent again" in refused


def test_up_refuses_bad_input_before_creating_anything(tmp_path):
    root = tmp_path / "never"
    env = clean_env(HOME=str(tmp_path))
    for argv, error in ((["--as", "main"], UsageError), (["--way-in", "http://127.0.0.1:1/x"], UsageError),
                        (["--no-way-in", "--way-in", "unix:/x", "--as", "a"], UsageError),
                        (["--route", "http://proxy"], UsageError),
                        (["--sandbox", str(tmp_path / "missing.toml")], LinkRunError)):
        with pytest.raises(error):
            up.plan(["--agent", str(root), *argv], env)
    bad = tmp_path / "bad.toml"
    bad.write_text("[tool.run]\ntimeot = 5\n")
    with pytest.raises(LinkRunError, match="unknown key 'timeot'"):
        up.plan(["--agent", str(root), "--spec", str(bad)], env)
    assert not root.exists()


def test_up_fails_closed_in_one_line_without_bubblewrap(box):
    # The machine as it is, but where bwrap is not an executable.
    done = subprocess.run(outer_sandbox("--ro-bind", "/dev/null", sandbox.find_system("bwrap"))
                          + SERVER + ["up", "--agent", str(box.root)], env=box.env, capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "bubblewrap (bwrap) is not installed" in done.stderr and "install it" in done.stderr


def test_up_fails_closed_in_one_line_when_namespaces_are_refused(box):
    done = subprocess.run(outer_sandbox("--disable-userns") + SERVER + ["up", "--agent", str(box.root)],
                          env=box.env, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "refused the sandbox its namespaces" in done.stderr


def test_up_fails_closed_when_the_files_folder_is_not_visible_inside(box):
    folder = box.folder
    fixed, _, _ = sandbox.build(folder, sandboxfile.load(None), box.env)
    at = fixed.index(folder.files)  # drop the files folder's bind from the sandbox
    del fixed[at - 1:at + 2]
    with pytest.raises(LinkRunError, match="is not visible inside the sandbox"):
        probe.probe(fixed, folder, ["work"])


def test_doctor_runs_every_check_and_says_what_to_do(box):
    ok = subprocess.run(SERVER + ["doctor", "--agent", str(box.root)], env=box.env, capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0, ok.stdout
    assert "ok   the sandbox starts" in ok.stdout and "programs offered: sh" in ok.stdout
    assert "ok   inside, the kernel's settings (/proc) and /dev are read-only, and no process has the " \
        "caller's environment" in ok.stdout
    if os.uname().machine in ("x86_64", "aarch64"):
        assert "ok   the syscall filter is loaded inside" in ok.stdout
    lines = ok.stdout.splitlines()
    scope = next(at for at, line in enumerate(lines) if "per-agent" in line)
    if lines[scope].startswith("warn"):  # no systemd user session here: what would give one
        assert "loginctl enable-linger" in lines[scope + 1] and "docs/troubleshooting.md" in lines[scope + 1]
    refused = subprocess.run(outer_sandbox("--disable-userns") + SERVER + ["doctor", "--agent", str(box.root)],
                             env=box.env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    assert "FAIL the kernel refused the sandbox its namespaces" in refused.stdout
    assert "     → " in refused.stdout


def test_up_names_the_programs_its_sandbox_file_adds_that_this_machine_lacks(tmp_path, servers):
    require_sandbox()
    box = Agent(tmp_path, '[commands]\nallow = ["sh", "nosuchprog", "/opt/nothing/bin/x"]\n')
    server = servers(SERVER + ["up", "--agent", str(box.root), "--sandbox", str(box.file)], env=box.env)
    server.initialize()
    assert server.close() == 0
    said = server.stderr.decode()
    assert ("the sandbox file allows nosuchprog, /opt/nothing/bin/x, which this machine does not have: "
            "they are not offered") in said, said
    plain = servers(SERVER + ["up", "--agent", str(tmp_path / "plain")], env=box.env)
    plain.initialize()
    assert plain.close() == 0
    assert "which this machine does not have" not in plain.stderr.decode()  # the embedded list's absent ones: no news


def test_up_with_no_arguments_gives_a_working_sandboxed_server(box, servers):
    server = servers(SERVER + ["up"], env=box.env)
    server.initialize()
    names = [tool["name"] for tool in server.request("tools/list")["result"]["tools"]]
    assert names == ["command", "read"]  # read: of a call's kept output
    default_files = Path(box.env["XDG_DATA_HOME"]) / "linkrun" / "agents" / "main" / "Files"
    result = server.call("command", {"program": "sh", "args": [
        "-c", "pwd; echo $HOME; ls /proc | grep -cE '^[0-9]+$'; (: > x) 2>/dev/null || echo read-only"]})
    assert "output" in text_of(result), text_of(result)
    pwd, home, processes, read_only = text_of(result).split("output")[1].split("\n")[1:5]
    assert (pwd, read_only) == (str(default_files), "read-only")
    assert home == str(default_files.parent / "Home")
    assert int(processes) <= 4
    assert server.close() == 0



def test_a_call_through_up_writes_work_and_is_refused_on_a_planted_link(box, servers):
    server = servers(SERVER + ["up", "--agent", str(box.root)], env=box.env)
    server.initialize()
    result = server.call("command", {"program": "sh", "args": ["-c", "echo hi > work/x && cat work/x"]})
    assert "hi" in text_of(result) and (box.files / "work" / "x").read_text() == "hi\n"
    os.rename(box.files / "work", box.files / "work-real")
    os.symlink("work-real", box.files / "work")
    refused = server.call("command", {"program": "sh", "args": ["-c", "true"]})
    assert refused.get("isError") and "work in the files folder is a link" in text_of(refused)
    assert server.close() == 0


def test_a_call_whose_syscall_filter_is_gone_is_refused_not_run_unfiltered(box, servers):
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("no syscall filter on this machine type")
    server = servers(SERVER + ["up", "--agent", str(box.root)], env=box.env)
    server.initialize()
    assert "ran" in text_of(server.call("command", {"program": "sh", "args": ["-c", "echo ran"]}))
    (box.root / "State" / "seccomp.bpf").unlink()
    refused = server.call("command", {"program": "sh", "args": ["-c", "echo ran > work/ran"]})
    assert refused.get("isError") and "syscall filter" in text_of(refused), text_of(refused)
    assert not (box.files / "work" / "ran").exists()
    assert server.close() == 0


@pytest.mark.parametrize("kept,text,said", [
    ("sandbox.toml", "[bogus]\n", "unknown section [bogus]"),
    ("sandbox.toml", "[limits]\nmemory = \"lots\"\n", "lots"),
    # A third new user's trial: a spec mended wrong ended up before its handshake.
    ("spec.toml", "[tool.run]\ntimout = 30\n", "[tool.run] has unknown key 'timout'"),
    ("spec.toml", "[tool.run\n", "is not valid TOML"),
])
def test_a_kept_file_mended_wrong_is_said_in_every_calls_answer_not_only_in_the_clients_log(box, servers, kept,
                                                                                          text, said):
    # A new user's trial: up ended before its handshake, and the client showed only a broken pipe.
    config = box.root / "Config"
    config.mkdir(parents=True, exist_ok=True)
    (config / kept).write_text(text)
    server = servers(SERVER + ["up", "--agent", str(box.root), "--no-way-in"], env=box.env)
    server.initialize()
    assert "command" in [tool["name"] for tool in server.request("tools/list")["result"]["tools"]]
    for name, arguments in (("command", {"program": "sh", "args": ["-c", ": > ran"]}),
                            ("start", {"program": "sh", "args": ["-c", ": > ran"]})):
        result = server.call(name, arguments)
        assert result.get("isError") and said in text_of(result) and str(config / kept) in text_of(result), \
            text_of(result)
        assert "start the agent again" in text_of(result), text_of(result)
        # A new user's trial: "the sandbox cannot start here" read as this machine's fault, not the file's.
        what = "sandbox file" if kept == "sandbox.toml" else "spec"
        assert text_of(result).startswith(f"Failed: the agent's {what} cannot be followed, so nothing runs: "), \
            text_of(result)
    assert not (box.root / "Files" / "ran").exists()
    assert server.close() == 1


def test_before_a_terminal_up_ends_at_once_on_a_kept_file_mended_wrong(box):
    import pty

    config = box.root / "Config"
    config.mkdir(parents=True, exist_ok=True)
    (config / "sandbox.toml").write_text("[bogus]\n")
    ours, theirs = pty.openpty()
    try:
        done = subprocess.run(SERVER + ["up", "--agent", str(box.root)], env=box.env, stdin=theirs,
                              capture_output=True, text=True, timeout=30)
    finally:
        os.close(ours)
        os.close(theirs)
    assert done.returncode == 1 and done.stdout == ""
    assert "unknown section [bogus]" in done.stderr


def test_the_small_tools_a_model_calls_by_name_run_with_the_defaults(box, servers):
    # A new user's trial: `echo hi` was refused as not allowed (sh -c 'echo hi' ran).
    server = servers(SERVER + ["up", "--agent", str(box.root)], env=box.env)
    server.initialize()
    for program, args, printed in (("echo", ["hi"], "hi"), ("pwd", [], str(box.root / "Files")),
                                   ("env", [], "HOME="), ("printf", ["%s", "x"], "x"),
                                   # and the next trial's: seq, tee and which were refused by name
                                   ("seq", ["3"], "1\n2\n3"), ("tee", [], "in"), ("which", ["sh"], "/sh"),
                                   # and a fourth's: sleep
                                   ("sleep", ["0"], "exit 0")):
        arguments = {"program": program, "args": args} | ({"input": "in"} if program == "tee" else {})
        result = server.call("command", arguments)
        assert not result.get("isError") and printed in text_of(result), text_of(result)
    assert server.close() == 0

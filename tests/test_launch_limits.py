"""A call's limits, set by the launch on the sandbox's init while bwrap waits
(its --block-fd) instead of by a `prlimit` exec before bwrap: they must hold
for the program as root and as an ordinary user."""

from __future__ import annotations

from pathlib import Path

from conftest import clean_env, require_sandbox, serve_argv, text_of
from up_harness import Up

from linkrun import agent
from linkrun.sandboxing import sandbox, sandboxfile

LIMITS = "for f in /proc/self/limits /proc/1/limits; do grep -E '^Max (core file size|file size|processes) ' $f; done"


def test_a_calls_program_and_init_have_the_limits_as_root_and_as_a_user(up_as: Up):
    result = up_as.command("sh", "-c", LIMITS)
    text = text_of(result)
    rows = [line.split() for line in text.splitlines() if line.startswith("Max ")]
    assert len(rows) == 6, text  # the program's three, and its init's
    found = {" ".join(row[1:-3]): (row[-3], row[-2]) for row in rows}
    assert found["core file size"] == ("0", "0"), text
    default_file_size = str(sandboxfile.load(None).file_size)
    assert found["file size"][0] == found["file size"][1] and int(found["file size"][0]) <= int(default_file_size)
    soft, hard = found["processes"]
    assert soft == hard and soft != "unlimited" and int(soft) >= 1024, text


def test_a_file_over_the_file_size_limit_is_cut_in_a_call(tmp_path, servers):
    require_sandbox()
    folder = agent.create(str(tmp_path / "agent"))
    settings = sandboxfile.parse({"limits": {"file": "1M"}}, "test")
    fixed, _, _ = sandbox.build(folder, settings, clean_env())
    server = servers(serve_argv(Path(folder.files), "--write", "work", programs=("sh",), sandbox=fixed), env=clean_env())
    server.initialize()
    result = server.call("command", {"program": "sh", "args": ["-c", "head -c 2000000 /dev/zero > work/big; echo $?"]})
    assert "output (4 bytes):\n153\n" in text_of(result), text_of(result)  # 128 + SIGXFSZ
    assert Path(folder.files, "work", "big").stat().st_size == 1024 * 1024
    assert server.close() == 0

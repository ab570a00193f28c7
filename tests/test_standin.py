"""The stand-in way in's life (`lnk-link-run way-in`): its flags, its signals,
its socket, its children."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import pytest
from conftest import REPO, SERVER, clean_env
from standin_helpers import AGENT, message

from linkrun.messages import wayin

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_stand_in_exits_0_on_sigterm_and_sigint(way_ins, sig):
    way_in = way_ins("--delay", "30")
    assert way_in.stop(sig) == 0


def test_the_stand_in_takes_over_a_stale_socket_but_never_a_live_one(way_ins, keyring, short_dir):
    socket_path = short_dir / "way-in.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(socket_path))
    stale.close()  # left behind, as by a stand-in that was killed
    way_in = way_ins(listen=f"unix:{socket_path}")
    assert wayin.send(way_in.address, AGENT, str(keyring), message()).outcome == "told"
    second = subprocess.run(SERVER + ["way-in", "--listen", f"unix:{socket_path}", "--keyring", str(keyring)],
                            capture_output=True, env=clean_env(), cwd=str(REPO), timeout=30)
    assert second.returncode == 2 and b"already listens" in second.stderr, second
    assert wayin.send(way_in.address, AGENT, str(keyring), message(id="cccccccccccccccc")).outcome == "told"


def test_the_stand_in_refuses_bad_flags_in_one_line(tmp_path):
    for flags in (["--listen", "http://example.org/in", "--keyring", str(tmp_path)],
                  ["--listen", "http://127.0.0.1:0/in"],
                  ["--listen", "http://127.0.0.1:0/in", "--keyring", str(tmp_path), "--status", "abc"],
                  ["--listen", "http://127.0.0.1:0/in", "--keyring", str(tmp_path), "--bogus", "1"]):
        done = subprocess.run(SERVER + ["way-in", *flags], capture_output=True, env=clean_env(),
                              cwd=str(REPO), timeout=30)
        assert done.returncode == 2, (flags, done)
        assert done.stderr.decode().count("\n") == 1 and done.stdout == b"", (flags, done)


def test_the_stand_in_help_names_its_test_flags():
    done = subprocess.run(SERVER + ["way-in", "--help"], capture_output=True, env=clean_env(),
                          cwd=str(REPO), timeout=30)
    assert done.returncode == 0
    for flag in ("--listen", "--keyring", "--status", "--retry-after", "--delay"):
        assert flag in done.stdout.decode()


def test_no_way_in_process_is_left_behind(way_ins):
    way_in = way_ins()
    pid = way_in.process.pid
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            children += [int(child) for child in f.read().split()]
    # Exit 0 is its own exit on SIGTERM: stop() kills only what outlives its wait.
    assert way_in.stop() == 0
    assert not [c for c in children if os.path.exists(f"/proc/{c}")], "a child of the way in outlived it"

"""A sandbox's kernel keyring: a session keyring of its own, empty, and
nothing of the caller's keys listed inside (issue 23, T2).

The caller runs in a session keyring of its own holding a `user` key with
a secret, as a user's login session holds a Kerberos cache's. The filter
refuses `keyctl` inside (test_seccomp.py); the first test runs without it,
so that what the sandbox possesses shows, as it would where no filter holds.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SYSTEM_PATH, require_sandbox
from sandbox_helpers import Agent
from up_harness import KEYRING_LAUNCHER, key_syscalls

from linkrun.sandboxing import launch, sandbox, sandboxfile

KEYCTL_GET_KEYRING_ID, KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_READ, KEYCTL_SEARCH = 0, 1, 11, 10
KEY_SPEC_SESSION_KEYRING = -3

# Inside, with keyctl's number, the caller's key's serial and its description:
# what the sandbox's session keyring is and holds, and whether the caller's key is reached.
LOOK = r"""
import ctypes, errno, json, sys
keyctl, serial, description = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode()
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long

def call(*args):
    ctypes.set_errno(0)
    result = libc.syscall(L(keyctl), *args)
    return result if result >= 0 else errno.errorcode[ctypes.get_errno()]

buffer = ctypes.create_string_buffer(4096)
print(json.dumps({
    "session": call(L(0), L(-3), L(0)),  # its id, none made
    "holds": call(L(11), L(-3), buffer, L(4096)),  # the serials it links, 4 bytes each
    "search": call(L(10), L(-3), ctypes.c_char_p(b"user"), ctypes.c_char_p(description), L(0)),
    "read": call(L(11), L(serial), buffer, L(4096)),
}))
"""


def keyctl_number() -> int:
    numbers = key_syscalls()
    if numbers is None:
        pytest.skip(f"the tests do not know keyctl's number on {os.uname().machine}")
    return int(numbers.split(",")[1])


def with_a_key(job: Callable[[int, str], None]) -> dict:
    """Run `job(serial, description)` on a thread started by one that joined
    a session keyring of its own holding a new `user` key (a thread's
    keyrings are its own, and a thread starts with its starter's), which
    keeps it while the job runs, as serve's other threads keep the caller's;
    returns what it saw: the session keyring's id."""
    keyctl, add_key = keyctl_number(), int(str(key_syscalls()).split(",")[0])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    L = ctypes.c_long
    seen: dict = {}

    def run() -> None:
        try:
            name = f"lnk-test-{secrets.token_hex(4)}".encode()
            assert libc.syscall(L(keyctl), L(KEYCTL_JOIN_SESSION_KEYRING), ctypes.c_char_p(name)) >= 0
            description, secret = f"krb_ccache:lnk-{secrets.token_hex(4)}@TEST", secrets.token_hex(8).encode()
            serial = libc.syscall(L(add_key), ctypes.c_char_p(b"user"), ctypes.c_char_p(description.encode()),
                                  ctypes.c_char_p(secret), ctypes.c_size_t(len(secret)), L(KEY_SPEC_SESSION_KEYRING))
            assert serial >= 0, os.strerror(ctypes.get_errno())
            seen["session"] = libc.syscall(L(keyctl), L(KEYCTL_GET_KEYRING_ID), L(KEY_SPEC_SESSION_KEYRING), L(0))
            spawner = threading.Thread(target=catching, args=(job, serial, description))
            spawner.start()
            spawner.join()
        except BaseException as problem:
            seen["problem"] = problem

    def catching(*args) -> None:
        try:
            args[0](*args[1:])
        except BaseException as problem:
            seen["problem"] = problem

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "problem" in seen:
        raise seen["problem"]
    return seen


def unfiltered(box: Agent) -> launch.Sandbox:
    """The agent's real sandbox, as serve runs a call in it, without the filter."""
    fixed, _, _ = sandbox.build(box.folder, sandboxfile.load(None), box.env)
    return launch.Sandbox(tuple(fixed), str(box.files), ("work",))


def launched(box: launch.Sandbox, tail: list[str]) -> str:
    """What `tail` prints, run in a launch of `box` spawned as serve spawns one."""
    with launch.prepare(box, tail) as it:
        with it.spawning():
            process = subprocess.Popen(it.argv, pass_fds=it.fds, env=it.env, cwd=box.files,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        init = it.started()
        out, err = process.communicate(timeout=120)
        if init is not None:
            os.close(init)
    assert process.returncode == 0, err
    return out.decode()


def test_each_sandbox_has_a_session_keyring_of_its_own_empty_without_the_callers_key(tmp_path):
    require_sandbox()
    box = unfiltered(Agent(tmp_path))
    python = shutil.which("python3", path=SYSTEM_PATH)
    assert python is not None
    looks: list[dict] = []

    def look_twice(serial: int, description: str) -> None:
        for _ in range(2):
            looks.append(json.loads(launched(box, [python, "-I", "-c", LOOK, str(keyctl_number()), str(serial),
                                                    description])))

    caller = with_a_key(look_twice)
    for look in looks:
        assert isinstance(look["session"], int) and look["session"] != caller["session"], (looks, caller)
        assert {name: look[name] for name in ("holds", "search", "read")} == {
            "holds": 0, "search": "ENOKEY", "read": "EACCES"}, looks
    assert looks[0]["session"] != looks[1]["session"]  # one for each sandbox: none is left for the next


def test_proc_keys_and_key_users_list_nothing_inside(tmp_path):
    """/proc/keys lists every key its reader's uid may view, possessed or not
    (a `user` key is viewable by its owner's uid): the sandbox's shows none."""
    require_sandbox()
    box = Agent(tmp_path)
    python = shutil.which("python3", path=SYSTEM_PATH)
    numbers = key_syscalls()
    if numbers is None or python is None:
        pytest.skip("the tests do not know the key syscalls' numbers here")
    description = f"krb_ccache:lnk-{secrets.token_hex(4)}@TEST"
    done = subprocess.run([python, "-I", "-S", "-c", KEYRING_LAUNCHER, numbers, description, "secret",
                           *box.argv("/bin/sh", "-c", "for f in keys key-users; do echo \"$f: $(cat /proc/$f)\"; done")],
                          env=box.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "keys: \nkey-users: \n", done.stdout


def test_keyctls_numbers_are_the_filters():
    from linkrun import kernel
    from linkrun.sandboxing import seccomp

    assert {machine: kernel.KEYCTL[machine] for machine in seccomp.SYSCALLS} == {
        machine: numbers["keyctl"] for machine, numbers in seccomp.SYSCALLS.items()}


def test_a_background_commands_program_has_a_session_keyring_of_its_own(servers, files, state):
    """A background command's gate, forked by its supervisor, enters a new session
    keyring itself (launch.Launch.enter) before it becomes the sandbox: nothing of
    the keyring serve was started in, which its supervisors inherit, is reached."""
    from background_helpers import background_argv, start, wait_ended

    from linkrun.detached.warm import FORKED
    from linkrun.state import layout

    python = shutil.which("python3", path=SYSTEM_PATH)
    assert python is not None
    looks: list[dict] = []
    forked: list[bool] = []

    def start_and_look(serial: int, description: str) -> None:
        server = servers(background_argv(files, state))  # spawned here: in the keyring with the key
        server.initialize()
        while len(looks) < 2 or not any(forked[-2:]):  # until two looked, the last of them through a warm fork
            command_id = start(server, program=python, args=["-I", "-c", LOOK, str(keyctl_number()), str(serial),
                                                             description])
            assert wait_ended(state, command_id)["exit"] == 0
            looks.append(json.loads((files / "background" / f"{command_id}.out").read_text()))
            forked.append(FORKED in Path(layout.path(str(state), command_id, layout.LOG)).read_text())
            assert len(looks) < 20, "no start went through the warm fork server"

    caller = with_a_key(start_and_look)
    for look in looks:
        assert isinstance(look["session"], int) and look["session"] != caller["session"], (looks, caller)
        assert {name: look[name] for name in ("holds", "search", "read")} == {
            "holds": 0, "search": "ENOKEY", "read": "EACCES"}, looks
    assert len({look["session"] for look in looks}) == len(looks)  # one for each command

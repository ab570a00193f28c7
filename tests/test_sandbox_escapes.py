"""What a program inside a call must never do (DESIGN.md §6, "The sandbox"),
proved through a real `lnk-link-run up` with real bubblewrap, once as root and
once as an ordinary user (the `up_as` fixture): change the kernel's settings
through /proc, read the caller's environment, reach the caller's session
keyring, fill /dev, or outlive its call.

Each program runs as `python3 -c PROGRAM args` in a call and prints what it
managed; the test reads that answer, or looks at the host's processes.
"""

from __future__ import annotations

import json
import os
import secrets
import signal

import orjson
import pytest
from conftest import parent_of, text_of, wait_for
from up_harness import KEY_DESCRIPTION, META, SECRET_VARIABLE, Up, key_syscalls, processes_with

# Each test starts a real `up` (as root or as an ordinary user) and may wait on it: more than the default.
pytestmark = pytest.mark.timeout(240)

# A few seconds for the sandbox to be gone once the call answered: its end is
# an event (a kill), not a wait.
GONE_WITHIN = 5

# Tries to open for writing every file of /proc with a write permission bit,
# but the per-process folders (the call's own), following no link; writes
# nothing. Prints how many it tried and opened, then those it opened.
#
# Before the fix (bwrap 0.8), 823 were tried. As root 767 opened: 764 under
# /proc/sys (abi 1, debug 1, dev 2, fs 46, kernel 112, net 550, vm 52; among
# them kernel/core_pattern, kernel/poweroff_cmd, fs/lease-break-time,
# vm/overcommit_memory) and /proc/pressure/{cpu,io,memory}. As an ordinary
# user 19: the sandbox's own ipc and pid namespaces' settings (fs/mqueue/*,
# kernel/msg*, sem, shm*, auto_msgmni, ns_last_pid, pid_max) and
# /proc/pressure/{cpu,io,memory} (mode 0666: a write adds a PSI trigger).
OPEN_KERNEL_FILES = r"""
import json, os, stat
PER_PROCESS = {"self", "thread-self"}
tried, opened = 0, []
def walk(folder, top):
    global tried
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if top and (entry.name.isdigit() or entry.name in PER_PROCESS):
            continue
        try:
            mode = entry.stat(follow_symlinks=False).st_mode
        except OSError:
            continue
        if stat.S_ISDIR(mode):
            walk(entry.path, False)
        elif stat.S_ISREG(mode) and mode & 0o222:
            tried += 1
            try:
                fd = os.open(entry.path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
            except OSError:
                continue
            os.close(fd)
            opened.append(entry.path)
walk("/proc", True)
print(json.dumps({"tried": tried, "opened": len(opened)}))
print("\n".join(opened))
"""

# Opens one harmless setting for writing, and writes nothing.
OPEN_LEASE_BREAK_TIME = r"""
import os
try:
    os.close(os.open("/proc/sys/fs/lease-break-time", os.O_WRONLY))
    print("opened for writing")
except OSError as error:
    print("refused:", error.strerror)
"""

# Opens a process's own kernel files for writing: its memory (which a write
# reaches through read-only mappings), its out-of-memory score, its name.
OPEN_OWN_PROC_FILES = r"""
import os
for name in ("mem", "oom_score_adj", "comm"):
    try:
        os.close(os.open(f"/proc/self/{name}", os.O_WRONLY))
        print(name, "opened for writing")
    except OSError as error:
        print(name, "refused:", error.strerror)
"""

# Reads the environment of every process inside; prints, per process, which
# of its variables name argv[1].
READ_ENVIRONMENTS = r"""
import os, sys
name = sys.argv[1].encode()
for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            found = [v.decode(errors="replace") for v in f.read().split(b"\0") if v.startswith(name)]
    except OSError as error:
        print(pid, "unreadable:", error.strerror)
        continue
    print(pid, "read:", found)
"""

# keyctl(2) from inside: argv[1] is "add_key,keyctl" (the system call
# numbers), argv[2] what to do: `search DESCRIPTION` looks for a user key in
# the session keyring (@s) and prints its payload; `add DESCRIPTION` adds one.
KEYS = r"""
import ctypes, os, sys
add_key, keyctl = (int(n) for n in sys.argv[1].split(","))
what, description = sys.argv[2], sys.argv[3].encode()
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
KEYCTL_SEARCH, KEYCTL_READ, KEY_SPEC_SESSION_KEYRING = 10, 11, -3
L = ctypes.c_long
if what == "add":
    serial = libc.syscall(L(add_key), ctypes.c_char_p(b"user"), ctypes.c_char_p(description),
                          ctypes.c_char_p(b"from a call"), ctypes.c_size_t(11), L(KEY_SPEC_SESSION_KEYRING))
    print("added", serial) if serial >= 0 else print("add refused:", os.strerror(ctypes.get_errno()))
    sys.exit()
serial = libc.syscall(L(keyctl), L(KEYCTL_SEARCH), L(KEY_SPEC_SESSION_KEYRING), ctypes.c_char_p(b"user"),
                      ctypes.c_char_p(description), L(0))
if serial < 0:
    print("not found:", os.strerror(ctypes.get_errno()))
    sys.exit()
buffer = ctypes.create_string_buffer(256)
size = libc.syscall(L(keyctl), L(KEYCTL_READ), L(serial), buffer, L(256))
print("found", serial, "holding", buffer.raw[:max(size, 0)].decode(errors="replace"))
"""

# Writes a new file in /dev, and uses what programs need of it.
USE_DEV = r"""
import json, os
outcome = {}
try:
    with open("/dev/fill", "wb") as f:
        f.write(b"x" * 4096)
    outcome["fill"] = "written"
except OSError as error:
    outcome["fill"] = "refused"
with open("/dev/null", "wb") as f:
    outcome["null"] = f.write(b"gone")
with open("/dev/zero", "rb") as f:
    outcome["zero"] = f.read(8).hex()
with open("/dev/urandom", "rb") as f:
    outcome["urandom"] = len(f.read(16))
with open("/dev/shm/note", "w") as f:
    f.write("kept in shm")
with open("/dev/shm/note") as f:
    outcome["shm"] = f.read()
print(json.dumps(outcome, sort_keys=True))
"""

# R2: ptraces the sandbox's init (pid 1, bwrap's, blocked in wait4) and makes
# it call prctl(PR_SET_PDEATHSIG, 0), so that it no longer dies with the
# outer bwrap; then starts a process that ignores SIGTERM, in a session of its
# own, holding argv[1] + "-left" in its command line. With argv[2] == "stay"
# it then sleeps (a call still running, or a background command). x86_64.
LEAVE_A_PROCESS_BEHIND = r"""
import ctypes, os, subprocess, sys, time
PTRACE_PEEKTEXT, PTRACE_SINGLESTEP, PTRACE_GETREGS, PTRACE_SETREGS = 1, 9, 12, 13
PTRACE_ATTACH, PTRACE_DETACH, WALL = 16, 17, 0x40000000
SYS_PRCTL, PR_SET_PDEATHSIG, SYSCALL_INSTRUCTION = 157, 1, 0x050F
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]

class Registers(ctypes.Structure):  # struct user_regs_struct
    _fields_ = [(name, ctypes.c_ulonglong) for name in
                "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss "
                "fs_base gs_base ds es fs gs".split()]

def registers():
    value = Registers()
    libc.ptrace(PTRACE_GETREGS, 1, None, ctypes.byref(value))
    return value

def clear_the_inits_death_signal():
    if libc.ptrace(PTRACE_ATTACH, 1, None, None) != 0:
        return "ptrace of pid 1 refused: " + os.strerror(ctypes.get_errno())
    os.waitpid(1, WALL)
    saved = registers()
    instruction = saved.rip - 2  # it stopped right after its syscall instruction
    if libc.ptrace(PTRACE_PEEKTEXT, 1, ctypes.c_void_p(instruction), None) & 0xFFFF != SYSCALL_INSTRUCTION:
        libc.ptrace(PTRACE_DETACH, 1, None, None)
        return "pid 1 was not stopped in a system call"
    prctl = Registers.from_buffer_copy(saved)
    # orig_rax -1: no restart of the interrupted call moves rip back first.
    prctl.rip, prctl.rax, prctl.orig_rax, prctl.rdi, prctl.rsi = instruction, SYS_PRCTL, 2**64 - 1, PR_SET_PDEATHSIG, 0
    libc.ptrace(PTRACE_SETREGS, 1, None, ctypes.byref(prctl))
    libc.ptrace(PTRACE_SINGLESTEP, 1, None, None)
    os.waitpid(1, WALL)
    returned = ctypes.c_longlong(registers().rax).value
    libc.ptrace(PTRACE_SETREGS, 1, None, ctypes.byref(saved))  # back into its wait4
    libc.ptrace(PTRACE_DETACH, 1, None, None)
    return f"prctl in pid 1 returned {returned}"

print(clear_the_inits_death_signal(), flush=True)
subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                  "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)", sys.argv[1] + "-left"],
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                 start_new_session=True)
print("left a process behind", flush=True)
if sys.argv[2] == "stay":
    time.sleep(600)
"""

x86_64_only = pytest.mark.skipif(os.uname().machine != "x86_64",
                                 reason="the program that traces the sandbox's init is written for x86_64")


def key_numbers() -> str:
    numbers = key_syscalls()
    if numbers is None:
        pytest.skip(f"the key system calls' numbers are not known here ({os.uname().machine})")
    return numbers


def printed_json(text: str) -> dict:
    """The JSON line a program printed, out of the call's answer."""
    return json.loads(next(line for line in text.splitlines() if line.startswith("{")))


def assert_the_init_was_cut_loose(printed: str) -> None:
    """Where Yama lets a program trace its ancestors (none, or ptrace_scope 0), the
    attack must have worked, or the test proves nothing of the init's end."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read())
    except FileNotFoundError:
        scope = 0
    if scope == 0:
        assert "prctl in pid 1 returned 0" in printed, printed


def printed_by(up: Up, command_id: str) -> str:
    """What a background command running LEAVE_A_PROCESS_BEHIND printed, once
    all of it reached its output file (its supervisor pumps it there a little
    after the program printed it)."""
    def whole() -> str | None:
        text = up.read_all(command_id)
        return text if "left a process behind" in text else None

    return wait_for(whole, timeout=60, what="the command's output to reach its file")


def nothing_left(tag: str) -> bool:
    return not processes_with(tag)


# /proc

def test_proc_kernel_files_are_read_only_inside(up_as: Up) -> None:
    text = up_as.python(OPEN_KERNEL_FILES)
    outcome = printed_json(text)
    assert outcome["tried"] > 100, text  # it did walk /proc/sys and the rest
    assert outcome["opened"] == 0, text


def test_a_kernel_setting_cannot_be_opened_for_writing(up_as: Up) -> None:
    assert "refused:" in up_as.python(OPEN_LEASE_BREAK_TIME)


def test_a_process_cannot_write_its_own_proc_files(up_as: Up) -> None:
    """/proc is read-only whole: one remount, not a bind per kernel folder."""
    text = up_as.python(OPEN_OWN_PROC_FILES)
    assert text.count("refused: Read-only file system") == 3, text


def test_a_program_writes_to_its_output_through_proc(up_as: Up) -> None:
    """What a read-only /proc leaves as it was: /dev/stderr and /proc/self/fd/N
    lead to the file itself, which is as writable as it was."""
    result = up_as.command("sh", "-c", "echo to-err >/dev/stderr; echo to-out >/proc/self/fd/1; "
                           "exec 3>/tmp/f; echo via-3 >/proc/self/fd/3; cat /tmp/f")
    text = text_of(result)
    assert not result.get("isError"), text
    assert "to-err" in text and "to-out" in text and "via-3" in text, text


# The caller's environment

def test_no_process_inside_a_call_holds_the_callers_environment(up_as: Up) -> None:
    text = up_as.python(READ_ENVIRONMENTS, SECRET_VARIABLE)
    assert " read: " in text, text  # it read at least its own
    assert up_as.env_secret not in text, text


def test_no_process_inside_a_background_command_holds_the_callers_environment(up_as: Up) -> None:
    command_id = up_as.start("python3", "-c", READ_ENVIRONMENTS, SECRET_VARIABLE)
    up_as.wait_ended(command_id)
    text = up_as.read_all(command_id)
    assert " read: " in text, text
    assert up_as.env_secret not in text, text


# The session keyring

def test_the_callers_session_keyring_is_out_of_reach(up_as: Up) -> None:
    text = up_as.python(KEYS, key_numbers(), "search", KEY_DESCRIPTION)
    assert up_as.key_secret not in text, text
    assert "not found:" in text, text


READ_KEY_LISTS = "for f in keys key-users; do echo \"$f: $(cat /proc/$f)\"; done"


def test_proc_lists_no_key_in_a_call_or_a_background_command(up_as: Up) -> None:
    """/proc/keys lists every key of the caller's uid that it may view, the caller's session's among them."""
    result = up_as.command("sh", "-c", READ_KEY_LISTS)
    assert not result.get("isError"), text_of(result)
    assert result["structuredContent"]["output"].splitlines() == ["keys: ", "key-users: "], text_of(result)
    command_id = up_as.start("sh", "-c", READ_KEY_LISTS)
    up_as.wait_ended(command_id)
    text = up_as.read_all(command_id)
    assert text.splitlines()[1:] == ["keys: ", "key-users: "], text  # after the read's own line


def test_a_key_added_by_one_call_is_not_found_by_the_next(up_as: Up) -> None:
    description = f"lnk-call-key-{secrets.token_hex(4)}"
    up_as.python(KEYS, key_numbers(), "add", description)
    text = up_as.python(KEYS, key_numbers(), "search", description)
    assert "not found:" in text, text


# Socket families

# Makes a vsock socket, and a pair of Unix sockets beside it; prints how each went.
VSOCK = r"""
import errno, socket
for name, family in (("vsock", 40), ("unix", socket.AF_UNIX)):
    try:
        socket.socket(family, socket.SOCK_STREAM).close()
        print(name, "made")
    except OSError as error:
        print(name, errno.errorcode[error.errno])
"""


def test_no_vsock_socket_opens_in_a_call(up_as: Up) -> None:
    """vsock is in no network namespace: on a virtual machine it reaches the hypervisor's listeners."""
    text = up_as.python(VSOCK)
    assert "vsock EAFNOSUPPORT\nunix made\n" in text, text


# /dev

def test_dev_takes_no_new_file_but_its_devices_and_shm_work(up_as: Up) -> None:
    outcome = printed_json(up_as.python(USE_DEV))
    assert outcome == {"fill": "refused", "null": 4, "zero": "00" * 8, "urandom": 16, "shm": "kept in shm"}


# Nothing of a call outlives it

@x86_64_only
def test_nothing_of_a_call_outlives_its_answer(up_as: Up) -> None:
    tag = up_as.tag()
    text = up_as.python(LEAVE_A_PROCESS_BEHIND, tag, "go")
    assert "left a process behind" in text, text
    assert_the_init_was_cut_loose(text)
    wait_for(lambda: nothing_left(tag), timeout=GONE_WITHIN,
             what=f"the call's processes to be gone after its answer ({text.strip()})")


@x86_64_only
def test_nothing_of_a_running_call_outlives_serve(up_as: Up) -> None:
    tag = up_as.tag()
    server = up_as.server
    server.send({"jsonrpc": "2.0", "id": "escape", "method": "tools/call", "params": {
        "name": "command", "arguments": {"program": "python3", "args": ["-c", LEAVE_A_PROCESS_BEHIND, tag, "stay"]}}})
    wait_for(lambda: processes_with(tag + "-left"), timeout=60, what="the call to leave its process")
    assert server.close(timeout=30) == 0
    wait_for(lambda: nothing_left(tag), timeout=GONE_WITHIN, what="the call's processes to be gone after serve exited")


@x86_64_only
def test_nothing_of_a_stopped_background_command_is_left(up_as: Up) -> None:
    tag = up_as.tag()
    command_id = up_as.start("python3", "-c", LEAVE_A_PROCESS_BEHIND, tag, "stay")
    wait_for(lambda: processes_with(tag + "-left"), timeout=60, what="the command to leave its process")
    printed = printed_by(up_as, command_id).strip()  # how its ptrace went
    assert_the_init_was_cut_loose(printed)
    answer = up_as.stop(command_id)
    assert "stopped" in answer, answer
    wait_for(lambda: nothing_left(tag), timeout=GONE_WITHIN,
             what=f"the command's processes to be gone after stop ({printed})")



@x86_64_only
def test_a_sweep_ends_the_sandbox_of_a_killed_supervisor(up_as: Up) -> None:
    tag = up_as.tag()
    command_id = up_as.start("python3", "-c", LEAVE_A_PROCESS_BEHIND, tag, "stay")
    wait_for(lambda: processes_with(tag + "-left"), timeout=60, what="the command to leave its process")
    assert_the_init_was_cut_loose(printed_by(up_as, command_id))
    record_file = up_as.state / f"{command_id}.json"
    wait_for(lambda: orjson.loads(record_file.read_bytes())["init_pid"], what="the record to name the sandbox's init")
    record = orjson.loads(record_file.read_bytes())
    supervisor = parent_of(record['leader_pid'])
    os.kill(supervisor, signal.SIGKILL)
    # The gate (the outer bwrap) dies with its supervisor; the init it cut loose does not.
    wait_for(lambda: "lost" in text_of(up_as.server.call("list", {}, meta=META)), timeout=30,
             what="list to sweep the command lost")
    wait_for(lambda: nothing_left(tag), timeout=GONE_WITHIN, what="the sweep to end the command's sandbox")


# Repositories in write folders, for root and for an ordinary user alike

# Tries what a program would do to a guarded repository: write a hook, append
# to its config, move the repository or its git folder aside (to plant a
# decoy in its place). Prints each outcome: the errno's name, or "done".
TAMPER_WITH_A_REPOSITORY = r"""
import errno, json, os
def attempt(action):
    try:
        action()
        return "done"
    except OSError as error:
        return errno.errorcode[error.errno]
def write_hook():
    with open("work/repo/.git/hooks/pre-commit", "w") as f:
        f.write("#!/bin/sh\necho planted\n")
def append_config():
    with open("work/repo/.git/config", "a") as f:
        f.write("[core]\n\tfsmonitor = echo planted\n")
print(json.dumps({
    "hook": attempt(write_hook),
    "config": attempt(append_config),
    "repository aside": attempt(lambda: os.rename("work/repo", "work/aside")),
    "git folder aside": attempt(lambda: os.rename("work/repo/.git", "work/repo/git-aside")),
    "a file beside": attempt(lambda: open("work/repo/notes.txt", "w").close()),
}, sort_keys=True))
"""


def test_a_repository_made_by_one_call_is_the_programs_to_change_and_obeys_nothing_of_it(up_as: Up) -> None:
    made = up_as.python("import os\nos.makedirs('work/repo/.git/hooks')\n"
                        "open('work/repo/.git/config', 'w').write('[core]\\n')\nprint('made')")
    assert "made" in made
    outcome = printed_json(up_as.python(TAMPER_WITH_A_REPOSITORY))
    assert outcome == {"a file beside": "ENOENT", "config": "done", "git folder aside": "ENOENT", "hook": "done",
                       "repository aside": "done"}, outcome
    repository = up_as.agent / "Files" / "work" / "aside" / ".git"
    assert os.listdir(repository / "hooks")[0].startswith("pre-commit.lnk-set-aside-")
    assert "fsmonitor" not in (repository / "config").read_text()

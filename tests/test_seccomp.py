"""The seccomp filter: what it denies inside a real bubblewrap sandbox, that a
foreign ABI is killed, and that the tools an agent uses still work under it.

Each sandboxed run is `bwrap --ro-bind / / --dev /dev --proc /proc
--unshare-all --die-with-parent --seccomp FD -- ...`, FD being the agent's
filter file opened afresh for that run, as serve and the gate do. The denied
syscalls are called through Python's ctypes `syscall()`, with arguments the
kernel itself would refuse with another error than EPERM (a bad flag, a bad
descriptor, a null pointer): so EPERM is the filter's, and nothing a probe
calls can succeed by mistake. `test_the_probes_reach_the_kernel_without_the_filter`
shows it.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import pwd
import re
import shutil
import signal
import struct
import subprocess
from pathlib import Path

import pytest
from conftest import SYSTEM_PATH, require_sandbox

from linkrun.state import layout
from linkrun.sandboxing import seccomp

TEST_USER = "lnk-seccomp-test"
AUDIT_ARCH_I386 = 0x40000003
AUDIT_ARCH_ARM = 0x40000028
CLONE_FILES, CLONE_FS, CLONE_THREAD, SIGCHLD = 0x400, 0x200, 0x10000, 17
CLONE_NEW_BITS = (0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000)
TIOCGWINSZ = 0x5413

# Run inside with the machine's syscall numbers as argv[1]; prints {probe: "ok" or the errno's name}.
PROBES = r"""
import ctypes, errno, json, os, sys
numbers = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)

def call(nr, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return "ok" if result != -1 else errno.errorcode[ctypes.get_errno()]

BAD = 0xFFFFFFFF
ARGS = {  # each refused by the kernel itself, for another reason than EPERM
    "io_uring_setup": (0, 0), "io_uring_enter": (-1, 0, 0, 0, 0, 0), "io_uring_register": (-1, 0, 0, 0),
    "keyctl": (0xDEAD,), "add_key": (0, 0, 0, 0, 0), "request_key": (0, 0, 0, 0),
    "bpf": (-1, 0, 0), "userfaultfd": (3,), "perf_event_open": (0, 0, -1, -1, BAD),
    "kexec_load": (0, 0, 0, BAD), "kexec_file_load": (-1, -1, 0, 0, BAD),
    "mount": (0, 0, 0, 0, 0), "umount2": (0, 0xFFFF), "pivot_root": (0, 0), "fsopen": (0, 0xFFFF),
    "fsconfig": (-1, 0xFFFF, 0, 0, 0), "fsmount": (-1, 0xFFFF, 0), "fspick": (-1, 0, 0xFFFF),
    "move_mount": (-1, 0, -1, 0, BAD), "open_tree": (-1, 0, BAD), "open_tree_attr": (-1, 0, BAD, 0, 0),
    "mount_setattr": (-1, 0, BAD, 0, 0), "setns": (-1, 0), "clone3": (0, 0),
}
out = {name: call(numbers[name], *args) for name, args in ARGS.items()}
CLONE_THREAD, CLONE_PARENT, CLONE_FILES = 0x10000, 0x8000, 0x400
for bit in (0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000):  # CLONE_NEW*
    out[f"clone {bit:#x}"] = call(numbers["clone"], bit | CLONE_THREAD)  # THREAD without SIGHAND: EINVAL
    out[f"unshare {bit:#x}"] = call(numbers["unshare"], bit | CLONE_PARENT)  # not unshare's: EINVAL
out["unshare 0x80"] = call(numbers["unshare"], 0x80 | CLONE_PARENT)  # CLONE_NEWTIME
fd = os.open("/dev/null", os.O_RDWR)
buffer = ctypes.create_string_buffer(64)
for request in (0x5412, 0x541C, 1 << 32 | 0x5412, 0x5413):
    out[f"ioctl {request:#x}"] = call(numbers["ioctl"], fd, request, ctypes.addressof(buffer))
out["unshare CLONE_FILES"] = call(numbers["unshare"], CLONE_FILES)
out["syscall -1"] = call(-1)
print(json.dumps(out))
"""

DENIED_INSIDE = (
    {name: "EPERM" for name in seccomp.DENIED}
    | {"clone3": "ENOSYS"}
    | {f"clone {bit:#x}": "EPERM" for bit in CLONE_NEW_BITS}
    | {f"unshare {bit:#x}": "EPERM" for bit in CLONE_NEW_BITS + (0x80,)}
    | {"ioctl 0x5412": "EPERM", "ioctl 0x541c": "EPERM", "ioctl 0x100005412": "EPERM"}
)
# What the filter lets through: the kernel answers.
ALLOWED_INSIDE = {"ioctl 0x5413": "ENOTTY", "unshare CLONE_FILES": "ok", "syscall -1": "ENOSYS"}
# Unprivileged, the kernel checks these callers' rights before their arguments.
PERMISSION_FIRST = {"kexec_load", "kexec_file_load", "pivot_root", "fsopen", "fsmount", "fspick", "move_mount"}


def machine() -> str:
    return platform.machine()


def need_filter() -> None:
    if seccomp.program() is None:
        pytest.skip(f"no seccomp filter for {machine()}")


def sandboxed(state: Path, argv: list[str], *, filtered: bool = True, writable: Path | None = None,
              user: str | None = None) -> subprocess.CompletedProcess:
    """One run in bubblewrap, under the agent's filter file opened afresh."""
    bwrap = shutil.which("bwrap")
    assert bwrap is not None
    command = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    if writable is not None:
        command += ["--bind", str(writable), str(writable)]
    command += ["--unshare-all", "--die-with-parent"]
    fds = []
    if filtered:
        path = seccomp.ensure(str(state))
        assert path is not None
        fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        command += ["--seccomp", str(fds[0])]
    home = str(writable or "/")
    environment = {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home}
    owner = {} if user is None else {"user": user, "group": user, "extra_groups": []}
    try:
        return subprocess.run(command + ["--"] + argv, pass_fds=fds, capture_output=True, text=True,
                              env=environment, cwd=home, timeout=300, **owner)
    finally:
        for fd in fds:
            os.close(fd)


def probe(state: Path, *, filtered: bool = True, user: str | None = None) -> dict[str, str]:
    numbers = json.dumps(seccomp.SYSCALLS[machine()])
    done = sandboxed(state, [need("python3"), "-I", "-c", PROBES, numbers], filtered=filtered, user=user)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# -- the program, read --------------------------------------------------------------------------


def run_filter(program: bytes, arch: int, nr: int, *args: int) -> int:
    """The verdict of the classic BPF program on one syscall, as the kernel
    computes it (the few instructions the filter uses)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *[a & (1 << 64) - 1 for a in args + (0,) * (6 - len(args))])
    pc, accumulator = 0, 0
    while True:
        code, true, false, k = struct.unpack_from("<HBBI", program, 8 * pc)
        if code == seccomp.LD_ABS:
            accumulator = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code == seccomp.RET:
            return k
        else:
            taken = {seccomp.JEQ: accumulator == k, seccomp.JGE: accumulator >= k,
                     seccomp.JSET: accumulator & k != 0}[code]
            pc += 1 + (true if taken else false)


EPERM = seccomp.RET_ERRNO | errno.EPERM
ENOSYS = seccomp.RET_ERRNO | errno.ENOSYS


@pytest.mark.parametrize("name", ["x86_64", "aarch64"])
def test_the_program_gives_each_syscall_its_verdict_on_both_machines(name):
    program = seccomp.program(name)
    assert program is not None and len(program) % 8 == 0 and len(program) // 8 < 4096
    numbers, arch = seccomp.SYSCALLS[name], seccomp.ARCHES[name]

    def verdict(syscall: str | int, *args: int, on: int = arch) -> int:
        return run_filter(program, on, numbers.get(syscall, syscall), *args)

    for denied in seccomp.DENIED:
        assert verdict(denied) == EPERM, denied
    assert verdict("clone3") == ENOSYS
    for bit in CLONE_NEW_BITS:
        assert verdict("clone", bit | SIGCHLD) == EPERM
        assert verdict("clone", 1 << 32 | bit) == EPERM  # only the low 32 bits count
        assert verdict("unshare", bit) == EPERM
    assert verdict("unshare", 0x80) == EPERM  # CLONE_NEWTIME
    assert verdict("clone", SIGCHLD) == seccomp.ALLOW  # fork
    assert verdict("clone", CLONE_THREAD | 0x3D0F00) == seccomp.ALLOW  # a thread, as glibc makes one
    assert verdict("clone", 0x80) == seccomp.ALLOW  # in clone's flags, 0x80 is the exit signal's byte
    assert verdict("unshare", CLONE_FILES | CLONE_FS) == seccomp.ALLOW
    for request in (seccomp.TIOCSTI, seccomp.TIOCLINUX, 1 << 32 | seccomp.TIOCSTI, 0xDEAD << 32 | seccomp.TIOCLINUX):
        assert verdict("ioctl", 0, request) == EPERM
    assert verdict("ioctl", 0, TIOCGWINSZ) == seccomp.ALLOW
    assert verdict("ioctl", seccomp.TIOCSTI, 0) == seccomp.ALLOW  # the request is the second argument
    for other in (0, 1, 59, 101, 221, 439, 500):  # x86_64's read, write, execve, ptrace; arm64's execve...
        if other not in numbers.values():
            assert verdict(other) == seccomp.ALLOW, other
    assert verdict(-1) == seccomp.ALLOW  # a tracer's skipped syscall: the kernel answers ENOSYS
    other_machine = next(a for n, a in seccomp.ARCHES.items() if n != name)
    for foreign in (AUDIT_ARCH_I386, AUDIT_ARCH_ARM, other_machine):
        assert verdict(20, on=foreign) == seccomp.KILL_PROCESS
    x32_getpid = seccomp.X32_SYSCALL_BIT | 39
    assert verdict(x32_getpid) == (seccomp.KILL_PROCESS if name == "x86_64" else seccomp.ALLOW)


# Socket families by number (linux/socket.h): those a sandbox keeps, and some of those it has no use for.
KEPT_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}
REFUSED_FAMILIES = {"AF_UNSPEC": 0, "AF_KEY": 15, "AF_PACKET": 17, "AF_RDS": 21, "AF_CAN": 29, "AF_TIPC": 30,
                    "AF_BLUETOOTH": 31, "AF_ALG": 38, "AF_VSOCK": 40, "AF_QIPCRTR": 42, "AF_SMC": 43, "AF_XDP": 44,
                    "AF_MCTP": 45, "a family yet to come": 46, "the largest": 0xFFFFFFFF}
EAFNOSUPPORT = seccomp.RET_ERRNO | errno.EAFNOSUPPORT


@pytest.mark.parametrize("name", ["x86_64", "aarch64"])
def test_the_program_refuses_every_socket_family_but_unix_inet_inet6_and_netlink(name):
    program = seccomp.program(name)
    assert program is not None
    numbers, arch = seccomp.SYSCALLS[name], seccomp.ARCHES[name]
    for call in ("socket", "socketpair"):
        for family in KEPT_FAMILIES.values():
            assert run_filter(program, arch, numbers[call], family, 1, 0) == seccomp.ALLOW, (call, family)
            assert run_filter(program, arch, numbers[call], 7 << 32 | family, 1, 0) == seccomp.ALLOW  # an int
        for what, family in REFUSED_FAMILIES.items():
            assert run_filter(program, arch, numbers[call], family, 1, 0) == EAFNOSUPPORT, (call, what)
        # The kernel reads the family as an int: high bits set over vsock's number still make vsock.
        assert run_filter(program, arch, numbers[call], 1 << 32 | 40, 1, 0) == EAFNOSUPPORT
    read = {"x86_64": 0, "aarch64": 63}[name]
    assert run_filter(program, arch, read, 40) == seccomp.ALLOW  # another syscall's 40 is no family


def test_there_is_no_filter_for_other_machines(tmp_path):
    assert seccomp.program("riscv64") is None and seccomp.program("i686") is None
    assert seccomp.ensure(str(tmp_path), "riscv64") is None
    assert list(tmp_path.iterdir()) == []


def header_numbers(path: str) -> dict[str, int]:
    with open(path) as f:
        return {m[1]: int(m[2]) for m in re.finditer(r"^#define __NR_(\w+)\s+(\d+)\s*$", f.read(), re.M)}


@pytest.mark.parametrize("name, headers", [
    ("x86_64", ["/usr/include/x86_64-linux-gnu/asm/unistd_64.h"]
     + (["/usr/include/asm/unistd_64.h"] if platform.machine() == "x86_64" else [])),
    ("aarch64", ["/usr/include/asm-generic/unistd.h"]),  # arm64's table is the generic one
])
def test_the_syscall_numbers_are_the_kernels(name, headers):
    found = next((h for h in headers if os.path.exists(h)), None)
    if found is None:
        pytest.skip(f"no kernel header for {name} here")
    kernel = header_numbers(found)
    assert "mount" in kernel and "ioctl" in kernel, f"{found} was not read"
    ours = seccomp.SYSCALLS[name]
    assert {n: kernel[n] for n in ours if n in kernel} == {n: v for n, v in ours.items() if n in kernel}
    # Older headers may lack the newest syscalls, which every machine numbers alike.
    assert all(ours[n] >= 424 for n in ours if n not in kernel)


def test_ensure_writes_the_file_whole_once_and_again_only_when_it_differs(tmp_path):
    old_umask = os.umask(0o077)
    try:
        path = seccomp.ensure(str(tmp_path))
    finally:
        os.umask(old_umask)
    if path is None:
        pytest.skip(f"no seccomp filter for {machine()}")
    assert path == str(tmp_path / layout.SECCOMP)
    first = os.stat(path)
    assert first.st_mode & 0o777 == 0o644
    assert Path(path).read_bytes() == seccomp.program()
    assert seccomp.ensure(str(tmp_path)) == path
    again = os.stat(path)
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)  # not rewritten
    Path(path).write_bytes(b"\0" * 8)  # an older filter
    stale = os.stat(path)
    assert seccomp.ensure(str(tmp_path)) == path
    assert Path(path).read_bytes() == seccomp.program()
    assert os.stat(path).st_ino != stale.st_ino  # replaced by a rename, never rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == [layout.SECCOMP]


# -- the filter, in a real sandbox -----------------------------------------------------------------


def test_each_denied_syscall_fails_with_eperm_inside(tmp_path):
    require_sandbox()
    need_filter()
    assert probe(tmp_path) == DENIED_INSIDE | ALLOWED_INSIDE


@pytest.fixture
def ordinary_user() -> str:
    if os.geteuid() != 0:
        pytest.skip("creating an ordinary user needs root (this test already runs as one)")
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        subprocess.run([useradd, "--system", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/usr/sbin/nologin", TEST_USER], check=True, capture_output=True)
    return TEST_USER


def io_uring_refused_to_users() -> bool:
    try:
        with open("/proc/sys/kernel/io_uring_disabled") as f:
            return f.read().strip() != "0"
    except FileNotFoundError:
        return False


def test_the_probes_reach_the_kernel_without_the_filter(tmp_path):
    """Without the filter no probe gets the filter's answer (EPERM; clone3:
    ENOSYS) but where the kernel checks the caller's rights first: so the
    tests of the filter can fail."""
    require_sandbox()
    need_filter()
    check_unfiltered(probe(tmp_path, filtered=False), os.geteuid() == 0)


def test_the_probes_reach_the_kernel_without_the_filter_for_an_ordinary_user(tmp_path, ordinary_user):
    require_sandbox()
    need_filter()
    check_unfiltered(probe(tmp_path, filtered=False, user=ordinary_user), False)


def check_unfiltered(answers: dict[str, str], root: bool) -> None:
    refused_first = {"kexec_load", "kexec_file_load"}  # CAP_SYS_BOOT is the first namespace's
    if not root:
        refused_first |= PERMISSION_FIRST | ({"io_uring_setup"} if io_uring_refused_to_users() else set())
    assert {name: answer for name, answer in answers.items()
            if answer == DENIED_INSIDE.get(name) and name not in refused_first} == {}
    assert {name: answers[name] for name in ALLOWED_INSIDE} == ALLOWED_INSIDE


def test_the_same_denials_hold_for_an_ordinary_user(tmp_path, ordinary_user):
    require_sandbox()
    need_filter()
    assert probe(tmp_path, user=ordinary_user) == DENIED_INSIDE | ALLOWED_INSIDE


def test_the_sandboxs_init_is_under_the_filter_too(tmp_path):
    """ptrace is allowed, so a program may trace bwrap's init (pid 1) and make
    it call what it likes: the init must be filtered as well."""
    require_sandbox()
    need_filter()
    # The init loads its filter just after it forks the program, so on a busy
    # machine the program may look first: it looks again, for up to 2 s.
    look = ("for i in $(seq 100); do grep -q '^Seccomp:.2' /proc/1/status && break; sleep 0.02; done; "
            "grep -h '^Seccomp:' /proc/1/status /proc/self/status")
    done = sandboxed(tmp_path, ["/bin/sh", "-c", look])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Seccomp:", "2", "Seccomp:", "2"]  # 2: a filter


ABI_PROGRAM = r"""
#include <stdio.h>
int main(int argc, char **argv) {
    long result;
    if (argv[1][0] == 'x')  /* getpid (39) in the x32 ABI */
        __asm__ volatile ("syscall" : "=a"(result) : "0"(0x40000000L + 39) : "rcx", "r11", "memory");
    else  /* getpid (20) in the i386 ABI */
        __asm__ volatile ("int $0x80" : "=a"(result) : "0"(20L) : "memory");
    printf("%ld\n", result);
    return 0;
}
"""
# Inside: run it without core files, and print how each ended.
RUN_ABI = r"""
import resource, subprocess, sys
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
for abi in ("x32", "i386"):
    print(abi, subprocess.run([sys.argv[1], abi], capture_output=True).returncode)
"""


def need(program: str, required: bool = False) -> str:
    found = shutil.which(program, path=SYSTEM_PATH)
    if found is None:
        if required and os.environ.get("LNK_REQUIRE_SANDBOX") == "1":
            pytest.fail(f"{program} is missing and LNK_REQUIRE_SANDBOX=1: install it")
        pytest.skip(f"{program} is not installed")
    return found


def test_a_syscall_of_a_foreign_abi_kills_the_process(tmp_path):
    """x32 and i386 numbers are not x86_64's: the filter would misread them."""
    require_sandbox()
    need_filter()
    if machine() != "x86_64":
        pytest.skip("the foreign ABIs tried here are x86_64's")
    gcc = need("gcc", required=True)
    (tmp_path / "abi.c").write_text(ABI_PROGRAM)
    subprocess.run([gcc, "-O0", "-o", str(tmp_path / "abi"), str(tmp_path / "abi.c")], check=True)
    done = sandboxed(tmp_path, [need("python3"), "-I", "-c", RUN_ABI, str(tmp_path / "abi")])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["x32", str(-signal.SIGSYS), "i386", str(-signal.SIGSYS)]


# Run inside with {name: family} as argv[1]: makes a socket of each family (and a pair of two), prints
# {name: "ok" or the errno's name}, then uses the families kept as programs do.
SOCKETS = r"""
import ctypes, errno, json, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)

def made(result, *fds):
    if result < 0:
        return errno.errorcode[ctypes.get_errno()]
    for fd in fds:
        os.close(fd)
    return "ok"

out = {}
for name, family in json.loads(sys.argv[1]).items():
    kind = socket.SOCK_DGRAM if name == "AF_NETLINK" else socket.SOCK_STREAM
    fd = libc.socket(family, kind, 0)
    out[name] = made(fd, fd)
pair = (ctypes.c_int * 2)()
for name, family in (("pair AF_UNIX", 1), ("pair AF_VSOCK", 40)):
    out[name] = made(libc.socketpair(family, socket.SOCK_STREAM, 0, pair), *(pair if pair[0] > 0 else ()))
    pair[0] = pair[1] = -1
uses = out["uses"] = {}
a, b = socket.socketpair()
a.send(b"x")
uses["unix"] = b.recv(1).decode()
for host, family in (("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6)):
    try:
        with socket.create_server((host, 0), family=family) as server:
            with socket.create_connection(server.getsockname()[:2], timeout=5) as client:
                client.send(b"y")
                uses[host] = server.accept()[0].recv(1).decode()
    except OSError as error:
        uses[host] = errno.errorcode[error.errno]
uses["interfaces"] = [name for _, name in socket.if_nameindex()]  # through netlink
for flags in (0, socket.AI_ADDRCONFIG):  # glibc asks netlink which families have an address
    try:
        uses[f"localhost {flags}"] = sorted({found[4][0] for found in socket.getaddrinfo("localhost", 80, flags=flags)})
    except socket.gaierror as error:
        uses[f"localhost {flags}"] = str(error)
print(json.dumps(out))
"""
PROBED_FAMILIES = KEPT_FAMILIES | {name: family for name, family in REFUSED_FAMILIES.items() if family < 0xFFFF}


def sockets(state: Path, *, filtered: bool = True, user: str | None = None) -> dict:
    done = sandboxed(state, [need("python3"), "-I", "-c", SOCKETS, json.dumps(PROBED_FAMILIES)], filtered=filtered,
                     user=user)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def check_sockets(state: Path, user: str | None = None) -> None:
    """Inside, only the kept families make sockets, the others fail with EAFNOSUPPORT; the kept ones
    work as they do without the filter (a loopback, the interfaces and names found through netlink)."""
    inside, unfiltered = sockets(state, user=user), sockets(state, filtered=False, user=user)
    assert inside.pop("uses") == unfiltered.pop("uses")
    assert inside == ({name: "ok" for name in KEPT_FAMILIES} | {"pair AF_UNIX": "ok"}
                      | {name: "EAFNOSUPPORT" for name in PROBED_FAMILIES if name not in KEPT_FAMILIES}
                      | {"pair AF_VSOCK": "EAFNOSUPPORT"})
    assert {name: unfiltered[name] for name in KEPT_FAMILIES} == {name: "ok" for name in KEPT_FAMILIES}
    if os.path.exists("/dev/vsock"):  # the kernel has vsock: without the filter, a socket is made
        assert unfiltered["AF_VSOCK"] == "ok", unfiltered


def test_a_socket_of_a_family_a_sandbox_has_no_use_for_fails_with_eafnosupport(tmp_path):
    """vsock above all: no network namespace covers it, so on a virtual machine it reaches the host's listeners."""
    require_sandbox()
    need_filter()
    check_sockets(tmp_path)


def test_the_same_socket_families_are_refused_for_an_ordinary_user(tmp_path, ordinary_user):
    require_sandbox()
    need_filter()
    check_sockets(tmp_path, ordinary_user)


# -- the tools still work ----------------------------------------------------------------------

THREADS_AND_SUBPROCESS = """
import subprocess, threading
results = []
threads = [threading.Thread(target=lambda: results.append(subprocess.run(["true"]).returncode)) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print("ok", results)
"""
NODE = """
const fs = require('fs');
const { execFileSync } = require('child_process');
const { Worker } = require('worker_threads');
fs.promises.readFile('/etc/hostname').then(() => {
  execFileSync('true');
  new Worker('require("worker_threads").parentPort.postMessage(6 * 7)', { eval: true })
    .on('message', (n) => console.log('ok', n));
});
"""
TOOLS = {  # tool: (argv, what its output must be, a regular expression)
    "sh": (["sh", "-c", "echo $((6 * 7)) | cat"], "42"),
    "python3": (["python3", "-c", THREADS_AND_SUBPROCESS], r"ok \[0, 0, 0, 0\]"),
    "git": (["sh", "-c", "git init -q r && cd r && echo x > f && git add f && "
             "git -c user.name=t -c user.email=t@example.org commit -qm one && git rev-list --count HEAD"], "1"),
    "gcc": (["sh", "-c", "printf '#include <stdio.h>\\nint main(void){puts(\"hello\");}\\n' > h.c "
             "&& gcc -o h h.c && ./h"], "hello"),
    "node": (["node", "-e", NODE], "ok 42"),
    "pip": (["python3", "-m", "pip", "--version"], r"pip \S+ from .*"),
    "npm": (["npm", "--version"], r"\d+\.\d+\.\d+"),
    "curl": (["sh", "-c", "curl --version > /dev/null && echo hi > f && curl -s file://$PWD/f"], "hi"),
    "strace": (["strace", "-f", "-e", "trace=execve", "true"], ""),
}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_the_tools_an_agent_uses_still_work_under_the_filter(tmp_path, tool):
    require_sandbox()
    need_filter()
    argv, expected = TOOLS[tool]
    found = need({"pip": "python3"}.get(tool, tool), required=tool == "gcc")
    if tool == "pip" and subprocess.run([found, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        pytest.skip("this machine's python3 has no pip")
    work = tmp_path / "work"
    work.mkdir()
    done = sandboxed(tmp_path, argv, writable=work)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(expected, done.stdout.strip()), done.stdout
    if tool == "strace":  # ptrace is allowed: it traced the program
        assert "execve(" in done.stderr, done.stderr


def test_the_filter_holds_for_a_program_started_by_a_traced_one(tmp_path):
    """ptrace is allowed; the filter is inherited by everything the sandbox
    starts, traced or not."""
    require_sandbox()
    need_filter()
    strace = need("strace")
    numbers = json.dumps(seccomp.SYSCALLS[machine()])
    done = sandboxed(tmp_path, [strace, "-f", "-o", "/dev/null", need("python3"), "-I", "-c", PROBES, numbers])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == DENIED_INSIDE | ALLOWED_INSIDE


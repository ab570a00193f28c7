"""The seccomp filter of every sandboxed call (DESIGN.md §6).

A small classic BPF program, built here by hand, that bubblewrap installs
with `--seccomp FD` just before it execs the program. It denies what no
agent program needs (a shell, Python, Node, git, curl, pip, npm, a C
compiler) and what escapes from sandboxes have gone through: io_uring, the
key syscalls, bpf, userfaultfd, perf_event_open, kexec, the mount API,
new namespaces, typing into a terminal (`TIOCSTI`, `TIOCLINUX`), and the
socket families a sandbox has no use for (vsock above all).

`ensure` writes it once per agent into the state folder; each call opens
that file afresh and hands the descriptor to bwrap, which reads it to its
end. Stdlib only, importing nothing of ours: building it takes about a
tenth of a millisecond, and serve, supervisors and the gate never import
it (they open the file).

The program, in order (each step ends in one of four verdicts):

1. The architecture: a syscall made in another ABI than the machine's own
   (i386 through `int 0x80` on x86_64, arm32 on aarch64) has other numbers,
   which the table below would misread: the process is killed.
2. On x86_64, a number with the x32 bit: the same reason, killed. -1 is let
   through: a tracer sets it to skip a syscall, and the kernel answers ENOSYS.
3. A syscall denied whatever its arguments: EPERM. `clone3`: ENOSYS, so
   that glibc and musl fall back to `clone`, whose flags the filter can read
   (clone3's are behind a pointer).
4. `clone` and `unshare` with a CLONE_NEW* flag in the low 32 bits of their
   first argument (the kernel reads no more): EPERM; without one they pass.
5. `ioctl` whose request, in the low 32 bits (the kernel truncates it to an
   int: comparing all 64 would let `TIOCSTI | 1 << 32` through), is
   `TIOCSTI` or `TIOCLINUX`: EPERM.
6. `socket` and `socketpair` whose family, in the low 32 bits of their
   first argument (an int to the kernel), is not one of FAMILIES:
   EAFNOSUPPORT, what a kernel built without that family answers, which
   programs handle (Python, Node and glibc fall back or say so).
7. Anything else: allowed. `ptrace` stays allowed: strace and debuggers are
   real tools; bwrap puts its init under the filter too, so a tracer gains
   no unfiltered process, and the sandbox is ended through its init, not
   only by `--die-with-parent`, which a tracer could clear.
"""

from __future__ import annotations

import errno
import os
import struct

from ..state import filing, layout

# linux/audit.h: the machine type with its 64-bit and little-endian bits.
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000

# linux/sched.h. CLONE_NEWTIME shares its bit with clone's exit signal
# (CSIGNAL, 0xff), so it is a namespace flag only for unshare (and clone3).
CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
CLONE_NEWTIME = 0x00000080
TIOCSTI = 0x5412
TIOCLINUX = 0x541C

# The socket families a sandbox keeps (linux/socket.h), each in the sandbox's
# own network namespace: Unix sockets, IPv4 and IPv6 (its loopback, and the
# agent's proxy), and netlink (glibc's getaddrinfo and if_nameindex, `ip`,
# Node's os.networkInterfaces ask it about the sandbox's own interfaces).
# Every other family is refused, those not yet made included, as Flatpak
# does: some reach past the network namespace (AF_VSOCK reaches the
# hypervisor of a virtual machine; AF_QIPCRTR, AF_IUCV their host), some
# need a capability the sandbox has not (AF_PACKET, AF_XDP), the rest are
# kernel code no agent program needs and escapes have gone through (AF_ALG,
# AF_CAN, AF_TIPC, AF_RDS, AF_BLUETOOTH, AF_KEY...).
FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}

# The syscalls denied whatever their arguments, by group (as docs/security.md lists them).
DENIED = (
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key",
    "bpf", "userfaultfd", "perf_event_open", "kexec_load", "kexec_file_load",
    "mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "open_tree_attr", "mount_setattr",
    "setns",
)

# Numbers from the kernel's tables: arch/x86/entry/syscalls/syscall_64.tbl,
# and include/uapi/asm-generic/unistd.h, which aarch64 uses. From 424 on
# (io_uring and later) every architecture shares its numbers.
_SHARED = {
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428,
    "open_tree_attr": 467, "mount_setattr": 442, "clone3": 435,
}
SYSCALLS = {
    "x86_64": {
        **_SHARED, "keyctl": 250, "add_key": 248, "request_key": 249,
        "bpf": 321, "userfaultfd": 323, "perf_event_open": 298, "kexec_load": 246, "kexec_file_load": 320,
        "mount": 165, "umount2": 166, "pivot_root": 155, "setns": 308, "clone": 56, "unshare": 272, "ioctl": 16,
        "socket": 41, "socketpair": 53,
    },
    "aarch64": {
        **_SHARED, "keyctl": 219, "add_key": 217, "request_key": 218,
        "bpf": 280, "userfaultfd": 282, "perf_event_open": 241, "kexec_load": 104, "kexec_file_load": 294,
        "mount": 40, "umount2": 39, "pivot_root": 41, "setns": 268, "clone": 220, "unshare": 97, "ioctl": 29,
        "socket": 198, "socketpair": 199,
    },
}
ARCHES = {"x86_64": AUDIT_ARCH_X86_64, "aarch64": AUDIT_ARCH_AARCH64}

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
# Both machines are little-endian: an argument's low 32 bits come first.
NR, ARCH = 0, 4


def arg_low(index: int) -> int:
    return 16 + 8 * index


# Classic BPF opcodes (linux/filter.h) and seccomp verdicts (linux/seccomp.h).
LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ, JGE, JSET = 0x15, 0x35, 0x45  # BPF_JMP | BPF_{JEQ,JGE,JSET} | BPF_K
RET = 0x06  # BPF_RET | BPF_K
KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
ALLOW = 0x7FFF0000


# One instruction: (code, k, where it jumps when true, when false), the
# targets named by label, None for the next instruction. Plain tuples: a
# dataclass would cost more to import than the whole filter to build.
Op = tuple[int, int, "str | None", "str | None"]


def load(offset: int) -> Op:
    return (LD_ABS, offset, None, None)


def jump(code: int, k: int, true: str | None = None, false: str | None = None) -> Op:
    return (code, k, true, false)


def ret(verdict: int) -> Op:
    return (RET, verdict, None, None)


def assemble(blocks: list[tuple[str, list[Op]]]) -> bytes:
    """Labelled blocks → struct sock_filter[] (u16 code, u8 jt, u8 jf, u32 k).
    Jumps go forward only, by at most 255 instructions: classic BPF has no
    loops, which is what lets the kernel check a filter at once."""
    starts, count = {}, 0
    for label, ops in blocks:
        starts[label] = count
        count += len(ops)
    out, index = bytearray(), 0
    for _, ops in blocks:
        for code, k, *targets in ops:
            offsets = [0 if target is None else starts[target] - index - 1 for target in targets]
            if not all(0 <= offset <= 255 for offset in offsets):
                raise ValueError(f"a jump from instruction {index} cannot reach its target")
            out += struct.pack("<HBBI", code, *offsets, k)
            index += 1
    return bytes(out)


def program(machine: str | None = None) -> bytes | None:
    """The filter for this machine type (`uname -m`), or None where the
    project has no syscall table for it (`doctor` then says no filter holds)."""
    if machine is None:
        # A 32-bit userland on a 64-bit kernel: uname says x86_64, but every
        # syscall would come in the foreign ABI, and be killed.
        machine = os.uname().machine if struct.calcsize("P") == 8 else "32-bit"
    if machine not in SYSCALLS:
        return None
    numbers = SYSCALLS[machine]
    head = [load(ARCH), jump(JEQ, ARCHES[machine], None, "kill"), load(NR)]
    if machine == "x86_64":
        head.append(jump(JGE, X32_SYSCALL_BIT, "x32"))
    head += [jump(JEQ, numbers[name], "eperm") for name in DENIED]
    head += [
        jump(JEQ, numbers["clone3"], "enosys"),
        jump(JEQ, numbers["clone"], "clone"),
        jump(JEQ, numbers["unshare"], "unshare"),
        jump(JEQ, numbers["ioctl"], "ioctl"),
        jump(JEQ, numbers["socket"], "socket"),
        jump(JEQ, numbers["socketpair"], "socket"),
        ret(ALLOW),
    ]
    kept = [jump(JEQ, family, "allow") for family in FAMILIES.values()]
    blocks = [
        ("head", head),
        ("x32", [jump(JEQ, 0xFFFFFFFF, "allow", "kill")]),
        ("clone", [load(arg_low(0)), jump(JSET, CLONE_NEW, "eperm", "allow")]),
        ("unshare", [load(arg_low(0)), jump(JSET, CLONE_NEW | CLONE_NEWTIME, "eperm", "allow")]),
        ("ioctl", [load(arg_low(1)), jump(JEQ, TIOCSTI, "eperm"), jump(JEQ, TIOCLINUX, "eperm", "allow")]),
        ("socket", [load(arg_low(0)), *kept, ret(RET_ERRNO | errno.EAFNOSUPPORT)]),
        ("kill", [ret(KILL_PROCESS)]),
        ("eperm", [ret(RET_ERRNO | errno.EPERM)]),
        ("enosys", [ret(RET_ERRNO | errno.ENOSYS)]),
        ("allow", [ret(ALLOW)]),
    ]
    return assemble(blocks)


def ensure(state: str, machine: str | None = None) -> str | None:
    """Write the filter to `<state>/seccomp.bpf`, whole (a temporary file
    beside it, then a rename), and only when its content differs, so that a
    call opening it meanwhile reads either the old filter or the new one.
    Returns its path, or None where this machine type has no filter.

    Each call must open the file afresh (`os.open(path, os.O_RDONLY |
    os.O_CLOEXEC)`), pass the descriptor (`pass_fds`, or
    `os.set_inheritable` before an exec) with `--seccomp <fd>` before the
    `--`, and close its own copy after bwrap started: bwrap reads the
    descriptor to its end, so one descriptor serves one call.
    """
    content = program(machine)
    if content is None:
        return None
    path = os.path.join(state, layout.SECCOMP)
    try:
        with open(path, "rb") as f:
            if f.read() == content:
                return path
    except FileNotFoundError:
        pass
    filing.write_whole(path, content, 0o644)
    return path


def for_agent(state: str) -> str | None:
    """`ensure`, for `up`, `doctor` and `sandbox`: a state folder that cannot
    be written is said in one line naming the fix."""
    try:
        return ensure(state)
    except OSError as error:
        from ..errors import LinkRunError

        raise LinkRunError(f"cannot write the sandbox's syscall filter in {state}: {error.strerror}",
                           "make the agent's state folder writable for you") from None

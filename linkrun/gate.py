"""The gate: waits until the record names its group, then becomes the sandbox.

Run by the supervisor as `python -I -S gate.py <supervisor pid> <control fd>`
(step 3): stdlib only and no package import, so it starts fast. It reads its
spec (one JSON line) from the control pipe, builds the per-call part of the
sandbox argv as serve does, and waits for the byte `G` (step 4) before it
execs the sandbox, the same process. A supervisor killed before `G` leaves a
gate that exits (EOF, or the death signal): nothing runs that a sweep cannot
find.
"""

import ctypes
import json
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> int:
    supervisor, control = int(sys.argv[1]), int(sys.argv[2])
    # 3. Die with the supervisor's main thread, which spawned us; then check it
    # is still our parent, or it died before the death signal was armed.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return 125
    if os.getppid() != supervisor:
        return 125

    line, rest = _read_line(control)
    spec = json.loads(line)

    # The per-call part, as serve appends it: same module, same checks.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import beneath

    files_fd = os.open(spec["files"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        folder_fd = beneath.open_folder(files_fd, spec["folder"])
        part, fds = [], []
        if spec["write"] or spec["proxy"]:
            import percall
            part, fds = percall.call_part(files_fd, spec["files"], spec["write"], spec["proxy"], spec["folder"])
    except Exception as problem:  # a link planted since start checked it
        print(f"lnk-link-run: the command was not run: {problem}", file=sys.stderr)
        return 126
    for fd in fds:
        os.set_inheritable(fd, True)  # bwrap closes them before it runs the program
    os.fchdir(folder_fd)
    os.close(folder_fd)
    os.close(files_fd)

    # 4. Wait for the record to name our group.
    if (rest or os.read(control, 1))[:1] != b"G":
        return 0
    os.close(control)
    argv = spec["sandbox"] + part + ["--"] + spec["command"]
    # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored
    # across exec: a `yes | head` would never end, and the file size limit
    # would not kill. subprocess restores them for serve's calls; we must here.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    try:
        os.execvp(argv[0], argv)
    except OSError as problem:
        print(f"lnk-link-run: cannot start the sandbox {argv[0]}: {problem.strerror}", file=sys.stderr)
        return 127


def _read_line(fd: int) -> tuple[bytes, bytes]:
    """The spec line, and whatever followed it in the same reads (perhaps `G`)."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(fd, 65536)
        if not chunk:
            sys.exit(0)  # the supervisor is gone
        data += chunk
    line, _, rest = data.partition(b"\n")
    return line, rest


if __name__ == "__main__":
    sys.exit(main())

"""The gate: waits until the record names its group, then becomes the sandbox.

Run by the supervisor (step 3) as

    python -I -S gate.py <supervisor pid> <control fd> clear|keep <sandbox argv...>

in the command's folder, with the per-call part's descriptors already
inherited: stdlib only, no package and nothing else imported, so it starts
fast. It arms its death signal, checks that the supervisor is still its
parent, and waits for the byte `G` on the control pipe (step 4) before it
execs the sandbox, the same process. A supervisor killed before `G` leaves a
gate that exits (EOF, or the death signal): nothing runs that a sweep cannot
find. `clear` execs the sandbox with an empty environment (a real sandbox:
bwrap's own environment is readable inside at /proc/1/environ); `keep`
passes ours on (a pass-through sandbox in tests).
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> int:
    supervisor, control, environment, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    # 3. Die with the supervisor's main thread, which spawned us; then check it
    # is still our parent, or it died before the death signal was armed.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return 125
    if os.getppid() != supervisor:
        return 125
    # 4. Wait for the record to name our group.
    if os.read(control, 1) != b"G":
        return 0
    os.close(control)
    # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored
    # across exec: a `yes | head` would never end, and the file size limit
    # would not kill. subprocess restores them for serve's calls; we must here.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    # Even started with none, Python adds LC_CTYPE to its own environment.
    env = {} if environment == "clear" else os.environ
    try:
        os.execve(argv[0], argv, env)
    except OSError as problem:
        print(f"lnk-link-run: cannot start the sandbox {argv[0]}: {problem.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())

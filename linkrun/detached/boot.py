"""The supervisor's first lines. serve starts a supervisor as

    python -I -S boot.py <folders> supervise <id> --state <dir>

so that `ps` shows the seeds' words, each a whole argument. Stdlib only and
tiny (a script is compiled at every run; the package comes from cached
bytecode): without site the interpreter starts in about half the time, so
this puts our package's and its libraries' folders on sys.path, then runs
the same `supervise()` as `lnk-link-run supervise` (which forks first).
serve's warm fork server starts the same way, with `warm-fork` and dashes
for `supervise <id>` (warm.py): it forks supervisors ready-imported.
"""

import os
import sys

if __name__ == "__main__":
    if len(sys.argv) != 6 or sys.argv[2] not in ("supervise", "warm-fork") or sys.argv[4] != "--state":
        sys.exit("usage: boot.py <folders> supervise <id> --state <dir> (started by serve, not by hand)")
    sys.path[:0] = sys.argv[1].split(os.pathsep)
    if sys.argv[2] == "warm-fork":
        from linkrun.detached.warm import serve_forks

        sys.exit(serve_forks(sys.argv[5]))
    from linkrun.detached.supervise import supervise

    sys.exit(supervise(sys.argv[3], sys.argv[5]))

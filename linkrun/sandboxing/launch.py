"""One sandbox launch: the whole argv of a call and the descriptors it needs.

Every place that runs a sandbox (a call in serve, a background command's
gate, `lnk-link-run sandbox`, the probe of `up` and `doctor`) builds it here:

    fixed part + per-call part + [--seccomp] [--info-fd] + -- + tail

and one object owns the descriptors from their opening to their closing.
The per-call part is added only for a real sandbox (serve's `--write` or
`--proxy`); a pass-through sandbox in tests gets the tail alone, and keeps
the caller's environment.

A real sandbox starts with an empty environment: bwrap's `--clearenv` clears
the program's, not bwrap's own, and bwrap's pid 1 keeps the environment it
was started with, readable inside at /proc/1/environ.

With the internet (`proxy_dir`), bwrap holds the program (`--block-fd`)
until the agent's proxy listens in the sandbox's network: `init_pidfd()`
hands it the sandbox's init (internet.hand_over) and then lets the program
run, with or without the internet (`no_internet` says why not).

bwrap's `--info-fd` gives the host pid of the sandbox's init (its pid 1):
`--die-with-parent` alone does not end a sandbox whose program traced its
init and cleared the init's death signal, while a SIGKILL to that init from
outside ends its pid namespace, and everything in it, always.

Each launch's sandbox has a kernel session keyring of its own, empty,
joined by the spawning thread (`spawning()`): a program reaches none of
the caller's keys, even where no filter refuses `keyctl`, and leaves none
for the next call.

The fixed part's `/etc` is the agent's prepared view (etcview.py): the
launch refreshes it when the host's changed, and binds the current view by
a descriptor it holds, with a shared flock, until it is closed, so no
rebuild removes it under the sandbox. A launch that watches the init sets
the fixed part's `prlimit` limits itself, on the init while bwrap waits on
`--block-fd`, and drops the `prlimit` exec.

With limits (serve's `--limits`), a launch that someone waits on gets a
cgroup of its own (cgroups.py), which the call is in before bwrap runs:
the caller spawns inside `launch.spawning()` (in cgroup v1 its thread is in
the group meanwhile, and the child is born there), and in cgroup v2 the argv
starts with a small `sh` that writes its pid into the group and execs the
rest (serve may not use `preexec_fn`). The caller takes the group
(`take_group`) once it spawned; a group never taken is removed with the
launch.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import signal
from collections.abc import Mapping, Sequence

from ..config import Limits
from ..kernel import own_session_keyring
from .initpid import init_pidfd
from .sandboxkey import shown

TYPE_CHECKING = False
if TYPE_CHECKING:  # cgroups is loaded only by a launch with limits: serve's start need not pay for it
    from typing import Any

    from .cgroups import Group, Place
    from .fallback import Holding
    from .etcwatch import EtcWatch
    from .gitcheck import GitLook
    from .keptgroups import KeptGroups



class Sandbox:
    """What a launch needs to know of the agent's sandbox, fixed for a server or a record."""

    def __init__(self, fixed: tuple[str, ...], files: str, write: tuple[str, ...] = (), proxy_dir: str | None = None,
                 seccomp: str | None = None, limits: Limits | None = None, etc_watch: EtcWatch | None = None,
                 longest: int | None = None, place: Place | None = None, groups: KeptGroups | None = None) -> None:
        self.fixed = fixed  # the sandbox command up built (or a pass-through in tests)
        self.files = files  # the files folder
        self.write = write  # write folders, relative to the files folder
        self.proxy_dir = proxy_dir  # the agent's proxy's folder, when calls have the internet
        self.seccomp = seccomp  # the filter file, opened afresh for each launch
        self.limits = limits  # each launch in a cgroup of its own with these, where one can be had
        self.etc_watch = etc_watch  # serve's watch of the host's /etc: a launch looks only after a change
        self.longest = longest  # the most seconds a launch runs: the span of a cpu limit held by an rlimit
        self.place = place  # where cgroups can be made; None: where this process can make them
        self.groups = groups  # serve's calls' groups, a launch's taken there; None: each made afresh

    @classmethod
    def of_record(cls, record: Mapping[str, Any]) -> Sandbox:
        """The sandbox a background command's record names (or serve's fields for one: spareahead.py)."""
        import math

        return cls(tuple(record["argv"]), record["files"], tuple(record["write"]), record["proxy"],
                   record.get("seccomp"), Limits.of_record(record.get("limits")), longest=math.ceil(record["timeout"]))

    @functools.cached_property
    def holding(self) -> Holding | None:
        """How each limit holds here (fallback.py): through the launch's cgroup, an rlimit, or not; None without limits."""
        if self.limits is None:
            return None
        from . import cgroups, fallback

        return fallback.holding(self.limits, self.place if self.place is not None else cgroups.place(), self.longest)

    @functools.cached_property
    def prlimit_prefix(self) -> tuple[int, tuple[tuple[int, int, int], ...]]:
        """The fixed part's `prlimit ... --` prefix, read once: its length and
        its limits, which a launch that watches its init sets on it itself
        (`init_pidfd`), an exec fewer per call. (0, ()) without one, or with
        a flag not known here."""
        if not self.fixed or os.path.basename(self.fixed[0]) != "prlimit" or "--" not in self.fixed:
            return 0, ()
        end = self.fixed.index("--")
        rlimits = []
        for flag in self.fixed[1:end]:
            name, _, value = flag.partition("=")
            if name not in _RLIMITS or not value.isdigit():
                return 0, ()
            rlimits.append((_RLIMITS[name], int(value), int(value)))
        return end + 1, tuple(rlimits)

    @functools.cached_property
    def etc_view_at(self) -> int:
        """Where the fixed part binds the agent's /etc view (`--ro-bind <view> /etc`), read once; -1 when it binds none."""
        from ..state.layout import ETC_VIEW
        from .etcview import ETC

        for at in range(len(self.fixed) - 2):
            if self.fixed[at] == "--ro-bind" and self.fixed[at + 2] == ETC and self.fixed[at + 1].endswith(f"/{ETC_VIEW}"):
                return at
        return -1

    @property
    def real(self) -> bool:
        """bwrap with a per-call part; without one, a pass-through that runs the tail as it is."""
        return bool(self.write or self.proxy_dir)


class Launch:
    """A sandbox's argv, ready to spawn. The caller spawns with `pass_fds=launch.fds`
    and `env=launch.env`, then calls `started()`; `close()` (or the `with`
    block's end) closes whatever is still open, on success and on error alike."""

    def __init__(self, argv: list[str], fds: list[int] | None = None, env: dict[str, str] | None = None,
                 git: GitLook | None = None) -> None:
        self.argv = argv
        self.fds = fds if fds is not None else []
        self.env = env
        self.git = git  # the repositories as they were before the program (gitcheck.py), checked at close()
        self.info_r: int | None = None  # our end of bwrap's --info-fd (bwrap's end is among `fds`)
        self.init_pid: int | None = None  # the sandbox's init, once `init_pidfd()` found it
        self.group: Group | None = None  # the launch's cgroup, until the caller takes it
        self.held: list[int] = []  # kept until `close()`: the pinned /etc view
        # (resource, soft, hard), set on the sandbox's init while bwrap holds the program
        self.rlimits: tuple[tuple[int, int, int], ...] = ()
        self.holding: Holding | None = None  # how the call's limits hold (fallback.py), for telling which bit
        self.proxy_dir: str | None = None  # with the internet: the proxy that listens inside
        self.block_w: int | None = None  # our end of bwrap's --block-fd: the program waits until it is closed
        self.no_internet: str | None = None  # why the program runs without the internet, if it does
        self.shown_args: list[str] = []  # the argv's binds and filter, for `key`
        self.git_notes: list[str] = []  # what that check set aside

    def command(self) -> list[str]:
        """The argv to spawn when the spawner runs no code of its own in the
        child (Popen, inside `spawning()`): with a cgroup v2 to join, a small
        shell joins it first. A forked child enters itself (`enter`) and runs `argv` as it is."""
        if self.group is None or self.group.version != 2:
            return self.argv
        return ["/bin/sh", "-c", JOIN, "sh", *self.group.procs, "--", *self.argv]

    def joins(self) -> tuple[str, ...]:
        """The files a forked child writes itself into to join the launch's cgroup (gate.py's `enter`)."""
        if self.group is None:
            return ()
        return tuple(self.group.procs if self.group.version == 2 else self.group.tasks)

    @functools.cached_property
    def key(self) -> tuple[object, ...]:
        """What the sandbox shows, by identity (`shown`): equal keys, equal
        sandboxes but for the folder. Read before the spawn, while the
        launch's descriptors are open; only a caller that compares pays it."""
        return shown(self.shown_args)

    def __enter__(self) -> Launch:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def started(self) -> int | None:
        """After the spawn: `handed_over()`, then `init_pidfd()`."""
        self.handed_over()
        return self.init_pidfd()

    def handed_over(self) -> None:
        """The child holds its descriptors now: close ours."""
        while self.fds:
            os.close(self.fds.pop())

    def init_pidfd(self) -> int | None:
        """A pidfd of the sandbox's init, once bwrap has made it (None for a
        pass-through sandbox, or when bwrap ended before it made one). The
        caller closes it. Our end of the info pipe stays open until `close()`:
        bwrap writes more after the pid, and a pipe without a reader would
        kill it with SIGPIPE."""
        if self.info_r is None:
            return None
        pidfd, self.init_pid = init_pidfd(self.info_r)
        if self.block_w is not None:
            self._before_program(pidfd)
        return pidfd

    def _before_program(self, pidfd: int | None) -> None:
        """While bwrap holds the program (--block-fd): the limits set on the
        sandbox's init, which the program inherits, and with the internet the
        proxy listening inside; then the program let go. Raises LinkRunError,
        the init killed, when the limits cannot be set: nothing runs without
        them. A failed hand-over lets the program run without the internet."""
        try:
            if pidfd is None or self.init_pid is None:
                return  # bwrap ended before its init: nothing waits
            self._set_limits(pidfd, self.init_pid)
            if self.proxy_dir is not None:
                from ..network.internet import hand_over  # only a launch with the internet pays for it

                self.no_internet = hand_over(self.proxy_dir, pidfd, self.init_pid)
        finally:
            self._let_go()

    def _set_limits(self, pidfd: int, init_pid: int) -> None:
        try:
            for which, soft, hard in self.rlimits:
                resource.prlimit(init_pid, which, (soft, hard))
        except OSError as error:
            from ..errors import LinkRunError
            from ..invocation import typed

            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            raise LinkRunError(f"cannot set the sandbox's limits on its init: {error.strerror}",
                               f"run {typed('doctor')}; report this as a bug") from None

    def _let_go(self) -> None:
        if self.block_w is not None:
            os.close(self.block_w)  # bwrap reads end of file, and runs the program (or finds it killed)
            self.block_w = None

    def spawning(self) -> contextlib.AbstractContextManager[None]:
        """Around the spawn: the spawning thread joins a new, empty session
        keyring, which the sandbox inherits in place of the caller's
        (`own_keyring`); in cgroup v1, the thread is in the group meanwhile, so the child is
        born in it (v2 joins through the argv)."""
        own_keyring()
        if self.group is not None and self.group.version == 1:
            return self.group.spawning()
        return contextlib.nullcontext()

    def take_group(self) -> Group | None:
        """After the spawn: the group is the caller's to kill, read and remove."""
        group, self.group = self.group, None
        return group

    def close(self) -> None:
        """After the sandbox ended (or never ran): the git check, then whatever is still open."""
        if self.git is not None:
            from .gitcheck import after

            look, self.git = self.git, None
            self.git_notes += after(look)  # after what a check while it ran did
        self.handed_over()
        self._let_go()
        while self.held:
            os.close(self.held.pop())
        if self.info_r is not None:
            os.close(self.info_r)
            self.info_r = None
        if self.group is not None:  # never taken: nothing ran in it
            self.group.remove(wait=1.0)
            self.group = None


def own_keyring() -> None:
    """This thread joins a new, empty session keyring, which what it spawns
    or execs next inherits (kernel.own_session_keyring); LinkRunError when
    it cannot."""
    try:
        own_session_keyring()
    except OSError as error:
        from ..errors import LinkRunError

        raise LinkRunError(f"cannot give the sandbox a kernel keyring of its own: {error.strerror}",
                           "call again; if it keeps failing, run lnk-link-run doctor") from None


def prepare(sandbox: Sandbox, tail: Sequence[str], folder: str = "", files_fd: int | None = None,
            watch_init: bool = True, grouped: bool = True, git_check: bool = True) -> Launch:
    """The launch of one call running `tail` in `folder` (relative to the files folder).

    `files_fd` is an open descriptor of the files folder, when the caller keeps
    one; else it is opened here. `watch_init=False` for a launch nobody waits
    on (an exec): bwrap would write its init's pid into a pipe nobody reads.
    Raises Refused (percall.LinkOnPath) when a link was planted on a path the
    sandbox binds (nothing is left open then). With limits and `watch_init`, the
    launch joins a new cgroup (LinkRunError when one cannot be made), unless
    `grouped=False`: then the caller calls `join_group` if it spawns it.
    With `git_check`, the repositories of the write folders are looked at
    now, and checked at `close()` (gitcheck.py): the caller closes the launch
    only once every process of its sandbox ended. A spare's launch, whose
    program comes later, takes none: the launch of its call does.
    """
    launch = _sandboxed(sandbox, tail, folder, files_fd, watch_init, git_check)
    if grouped:
        join_group(launch, sandbox, watch_init)
    return launch


def join_group(launch: Launch, sandbox: Sandbox, watch_init: bool = True) -> None:
    """With limits, the launch's cgroup (see prepare)."""
    if sandbox.limits is not None and watch_init and sandbox.holding is not None and sandbox.holding.by_cgroup:
        _join_group(launch, sandbox.limits, sandbox.groups)


# Writes its own pid into each `cgroup.procs` named before `--`, then becomes the rest.
JOIN = ('while [ "$1" != -- ]; do echo $$ >"$1" || { echo "lnk-link-run: cannot join the cgroup of its limits: $1" >&2; '
        'exit 125; }; shift; done; shift; exec "$@"')


def _join_group(launch: Launch, limits: Limits, groups: KeptGroups | None) -> None:
    try:
        from . import cgroups

        launch.group = groups.take(limits) if groups is not None else cgroups.make(limits)
    except OSError as error:
        launch.close()
        from ..errors import LinkRunError
        from ..invocation import typed

        raise LinkRunError(f"cannot make the call's cgroup for its limits: {error}",
                           f"run {typed('doctor')}, which says which limits can hold here") from None


def _sandboxed(sandbox: Sandbox, tail: Sequence[str], folder: str, files_fd: int | None,
               watch_init: bool, git_check: bool) -> Launch:
    if not sandbox.real:
        if len(sandbox.fixed) == 1 and os.path.basename(sandbox.fixed[0]) == "env":
            # env with nothing to set only execs the rest: run that, and save an
            # exec (half a millisecond of the tests' and the bench's pass-through).
            return Launch(list(tail))
        return Launch(list(sandbox.fixed) + ["--", *tail])
    from . import gitcheck, percall  # only a real sandbox pays for them

    own_fd = files_fd is None
    fd = os.open(sandbox.files, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if files_fd is None else files_fd
    try:
        look = gitcheck.look(fd, sandbox.files, sandbox.write) if git_check else None
        part, fds = percall.call_part(fd, sandbox.files, sandbox.write, folder)
    finally:
        if own_fd:
            os.close(fd)
    chdir_at = len(part) - 2  # call_part ends with it
    launch = Launch([], fds, env={}, git=look)
    try:
        fixed = _with_etc_view(sandbox, launch)
        if sandbox.seccomp is not None:
            try:
                filter_fd = os.open(sandbox.seccomp, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError as error:
                from ..errors import LinkRunError

                raise LinkRunError(f"cannot open the sandbox's syscall filter {sandbox.seccomp}: {error.strerror}",
                                   "start the agent again with lnk-link-run up, which writes it") from None
            launch.fds.append(filter_fd)
            part += ["--seccomp", str(filter_fd)]
        # All but the call part's closing `--chdir`: a spare enters the call's folder itself.
        launch.shown_args = fixed + [arg for at, arg in enumerate(part) if at not in (chdir_at, chdir_at + 1)]
        if watch_init:
            launch.info_r, info_w = os.pipe2(os.O_CLOEXEC)
            launch.fds.append(info_w)
            part += ["--info-fd", str(info_w)]
            fixed = _limits_without_exec(sandbox, fixed, launch, part)
            if sandbox.proxy_dir is not None:
                launch.proxy_dir = sandbox.proxy_dir
                part += _hold_program(launch)
    except BaseException:
        launch.close()
        raise
    launch.argv = fixed + part + ["--", *tail]
    return launch


def _hold_program(launch: Launch) -> list[str]:
    """bwrap waits, before it runs the program, until `init_pidfd()` let it go (one pipe a launch)."""
    if launch.block_w is not None:
        return []
    block_r, launch.block_w = os.pipe2(os.O_CLOEXEC)
    launch.fds.append(block_r)
    return ["--block-fd", str(block_r)]


def _with_etc_view(sandbox: Sandbox, launch: Launch) -> list[str]:
    """The fixed part binding the current /etc view by a descriptor that the
    launch holds until the sandbox ended (etcview.py), the view refreshed
    first when the host's /etc changed (seen by the sandbox's watch, or by a
    look once a second without one); as it is when it binds none."""
    fixed = list(sandbox.fixed)
    at = sandbox.etc_view_at
    if at >= 0:
        from .etcview import pin, refresh

        refresh(fixed[at + 1], sandbox.etc_watch)
        view = pin(fixed[at + 1])
        launch.fds.append(view)
        launch.held.append(os.dup(view))  # the flock stays once bwrap closed its copy
        fixed[at:at + 2] = ["--ro-bind-fd", str(view)]
    return fixed


def _limits_without_exec(sandbox: Sandbox, fixed: list[str], launch: Launch, part: list[str]) -> list[str]:
    """The fixed part without its `prlimit ... --` prefix, whose limits the
    launch sets on the sandbox's init itself while bwrap holds the program,
    with the call's limits that no cgroup holds here (fallback.py): the
    lower of two for one resource."""
    length, launch.rlimits = sandbox.prlimit_prefix
    launch.holding = sandbox.holding
    if launch.holding is not None and launch.holding.by_rlimit:
        launch.rlimits = launch.holding.with_rlimits(launch.rlimits)
    if not length and not launch.rlimits:
        return fixed
    part += _hold_program(launch)
    return fixed[length:]


_RLIMITS = {"--core": resource.RLIMIT_CORE, "--fsize": resource.RLIMIT_FSIZE, "--nproc": resource.RLIMIT_NPROC}


def program_argv(program: str, args: Sequence[str], variables: Sequence[tuple[str, str]] = ()) -> list[str]:
    """What follows the sandbox's `--`: the program, through env when --var is given."""
    if variables:
        return ["/usr/bin/env"] + [f"{name}={value}" for name, value in variables] + [program, *args]
    return [program, *args]

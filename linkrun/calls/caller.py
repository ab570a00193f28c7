"""Serve's calls, owned in one place below the tool layer: a checked Request
in, an Outcome out. Made once, when the tool layer loads; closed once, at
serve's end.

It owns what serve's calls share: the files folder's descriptor, the
sandbox's watch of the host's /etc (etcwatch.py), the spares
(spare.py), the agent's proxy (internet.Users), the kept cgroups
(keptgroups.py), the runner and its leftovers (runner.Runner); and the work
begun after serve's first answer (the limits said, the proxy started, the
spares made, the strays ended).

A call (`run`): the call's folder opened beneath the files folder, its
launch prepared (launch.py), its size checked against execve's, the proxy
listening, a spare taken or a cgroup joined, the program run and watched,
then the launch and the folder closed, and the notes the answer needs set
on the outcome (the git check's, the internet's). `start`'s trial (`check`)
is the same launch made and closed at once: a planted link is refused then,
not in the background command's gate.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Hashable

from .. import logger
from ..config import Serve
from ..errors import LinkRunError
from ..invocation import typed
from ..processes.keeper import Keeper
from ..processes.runner import Cancel, Later, Outcome, Request, Runner, open_folder
from ..processes.spare import LOADER_TAIL, NotNow, Spare, Spares, script
from ..sandboxing.launch import Launch, join_group, prepare, program_argv
from .setup import CallSetup, check_exec_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..network.internet import Users
    from ..sandboxing.cgroups import Place
    from ..sandboxing.fallback import Holding
    from ..sandboxing.keptgroups import KeptGroups


class Caller:
    """Serve's calls: their launch, the spares, the /etc watch, the proxy, the strays, the limits, and their closing."""

    def __init__(self, settings: Serve, setup: CallSetup) -> None:
        self.settings = settings
        self.sandbox = setup.sandbox
        self.programs = setup.programs
        self._files_fd: int | None = None
        self._etc_watch_asked = threading.Lock()  # the first launch starts the watch, the others wait
        self._etc_watch_started = False
        self.groups: KeptGroups | None = None
        if settings.limits is not None:
            from ..sandboxing.keptgroups import KeptGroups  # only serve with limits pays for cgroups

            self.groups = self.sandbox.groups = KeptGroups()
        self.runner = Runner(self.groups)
        # A sandbox made ahead of each call (spare.py), for a real sandbox with its init watched.
        self.spares = Spares(self._prepare_spare, self._start_spare, self.runner.end_spare) if self.sandbox.real else None
        self.proxy: Users | None = None
        if settings.proxy and settings.state:
            from ..network.internet import Users

            self.proxy = Users(settings.state)

    @property
    def holding(self) -> Holding | None:
        """How the calls' limits hold here (fallback.py), read at its first use; None without limits."""
        return self.sandbox.holding

    def started(self) -> None:
        """After serve's first answer: what may wait until then."""
        if self.settings.limits is not None:
            threading.Thread(target=self._say_limits_that_do_not_hold, daemon=True, name="limits").start()
        if self.proxy is not None:
            threading.Thread(target=self._proxy_ready, daemon=True, name="proxy").start()
        if self.spares is not None:
            self.spares.make()
        if self.sandbox.real:
            threading.Thread(target=self._end_strays, daemon=True, name="strays").start()

    def close(self) -> None:
        """At serve's end, once its calls answered or were killed: the spares
        ended, the leftovers killed, the cgroups removed, the proxy let go
        (it is the agent's, and runs on), the /etc and programs watches stopped. The files
        folder's descriptor stays open until the process ends: a call killed
        late may still open beneath it, and its number, closed and reused by
        another open, would put that call's folder beneath another folder."""
        if self.spares is not None:
            self.spares.close()
        self.runner.close()
        if self.groups is not None:
            self.groups.close()
        if self.proxy is not None:
            self.proxy.close()
        with self._etc_watch_asked:
            self._etc_watch_started = True  # none starts any more
            watch, self.sandbox.etc_watch = self.sandbox.etc_watch, None
        if watch is not None:
            watch.close()
        self.programs.close()

    # -- a call ------------------------------------------------------------

    def run(self, request: Request, cancel: Cancel, progress: Callable[[float, int], None] | None = None,
            keepers: tuple[Keeper, Keeper] | None = None, later: Later | None = None) -> Outcome:
        """Run one call (see the module's docstring): Refused or LinkRunError
        before anything ran; `progress` and `keepers` as runner.Runner.run.
        What the call leaves to do once it is answered goes to `later`, which
        the sender of its answer runs once it is out; without one, it is done
        before this returns."""
        if later is None:
            later = Later()
            try:
                return self.run(request, cancel, progress, keepers, later)
            finally:
                later.run()
        folder_fd = open_folder(self.files_descriptor(), request.folder)
        counted = False  # by the spares, as a call in flight
        try:
            with self._launch(request, grouped=False) as launch:
                check_exec_size(launch)
                no_internet = self._proxy_ready() if self.proxy is not None else None
                since = time.time()
                counted = self.spares is not None
                spare = self._take_spare(request, launch)
                if spare is None:
                    join_group(launch, self.sandbox)
                try:
                    outcome = self.runner.run(request, launch, folder_fd, cancel, self.settings.output, later,
                                              progress, spare, keepers)
                finally:
                    if spare is not None:
                        later.add(spare.close)
                no_internet = no_internet or launch.no_internet
        finally:
            os.close(folder_fd)
            if self.spares is not None:
                later.add(functools.partial(self.spares.done, counted))
        outcome.git_notes, outcome.no_internet = launch.git_notes, no_internet
        if not no_internet and not outcome.cancelled and self.proxy is not None and self.settings.state:
            outcome.refused = refusals(self.settings.state, since, outcome.pid)
        return outcome

    def check(self, request: Request) -> None:
        """`start`'s trial, before its record is made: its folder and its
        launch made and closed at once (a planted link is refused now, not in
        the gate), and its size checked against execve's."""
        os.close(open_folder(self.files_descriptor(), request.folder))
        with self._launch(request, watch_init=False, git_check=False) as launch:
            check_exec_size(launch)

    def files_descriptor(self) -> int:
        """The files folder, opened once: every call's folder is opened beneath it."""
        if self._files_fd is None:
            self._files_fd = os.open(self.settings.files, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return self._files_fd

    def argv_tail(self, request: Request) -> list[str]:
        """What follows the sandbox's `--`: the program, through env when --var is given."""
        return program_argv(request.program, request.args, self.settings.variables)

    def _launch(self, request: Request, watch_init: bool = True, grouped: bool = True,
                git_check: bool = True) -> Launch:
        """The call's whole sandbox argv and its descriptors (see launch.py); a
        link planted on a path it binds is Refused, naming it."""
        self._watch_etc()
        return prepare(self.sandbox, self.argv_tail(request), request.folder, self.files_descriptor(), watch_init,
                       grouped, git_check)

    # -- the spares --------------------------------------------------------

    def _key(self, launch: Launch) -> tuple[object, ...]:
        """What a sandbox made now would show (Launch.key), and which proxy listens in it."""
        return launch.key, self.proxy.generation if self.proxy is not None else 0

    def _prepare_spare(self) -> tuple[Launch, Hashable]:
        if self.proxy is not None and not self.proxy.running():
            raise NotNow  # a call starts the proxy and waits for it; a spare never does
        self._watch_etc()
        launch = prepare(self.sandbox, LOADER_TAIL, "", self.files_descriptor(), git_check=False)  # its call's looks
        return launch, self._key(launch)

    def _start_spare(self, launch: Launch, key: Hashable) -> Spare:
        return self.runner.start_spare(launch, key, self.settings.files)

    def _take_spare(self, request: Request, launch: Launch) -> Spare | None:
        """The spare for this call, handed its script; None when a sandbox is
        made for it (no spare shows what it would, or the one taken ended
        before it read the script: nothing of the call ran, its input is whole)."""
        if self.spares is None:
            return None
        data = script(self.argv_tail(request), request.folder, self.settings.files, bool(request.input))
        spare = self.spares.take(self._key(launch), use=data is not None)
        if spare is None or data is None:
            return None
        handed = spare.hand_over(data, bool(request.input))
        self.spares.handed(spare, handed)
        return spare if handed else None

    # -- serve's watch, proxy, strays and limits ---------------------------

    def _watch_etc(self) -> None:
        """At the first launch (not at start: initialize never waits for it),
        the watch of the host's /etc that lets a launch skip its look when
        nothing changed (etcwatch.py), for a real sandbox that binds the
        agent's view; then the programs path's (programs.py). They run until
        serve's end (`close`)."""
        with self._etc_watch_asked:
            if self._etc_watch_started:
                return
            self._etc_watch_started = True
            at = self.sandbox.etc_view_at
            if self.sandbox.real and at >= 0:
                from ..sandboxing.etcview import source_of
                from ..sandboxing.etcwatch import EtcWatch

                self.sandbox.etc_watch = EtcWatch.start(source_of(self.sandbox.fixed[at + 1]))
            # After /etc's, which keeps what the sandbox shows current: this
            # one only saves each call its program's lookup, with what
            # inotify watches are left.
            self.programs.watch()

    def _proxy_ready(self) -> str | None:
        """Start the agent's proxy if none runs; None, or why the call has no internet."""
        assert self.proxy is not None  # called only with the proxy
        try:
            self.proxy.ensure()
            return None
        except (LinkRunError, OSError) as problem:
            why = problem.message if isinstance(problem, LinkRunError) else str(problem)
            logger.warning(why)
            return why

    def _end_strays(self) -> None:
        """The agent's sandboxes a killed serve or supervisor left behind (strays.py)."""
        from ..sandboxing import strays

        ended = strays.end(self.settings.files)
        if ended:
            logger.info(f"ended {ended} sandbox process(es) of this agent that a killed serve or "
                        f"supervisor had left behind")

    def _say_limits_that_do_not_hold(self) -> None:
        from ..sandboxing import cgroups  # not at start: initialize never waits for it

        assert self.sandbox.holding is not None  # started only with limits
        for line in limit_warnings(self.sandbox.holding, cgroups.place()):
            logger.warning(line)


def refusals(state: str, since: float, pid: int) -> str | None:
    """The notes on the hosts the agent's proxy refused the sandbox `pid`
    since `since`, and on those it allowed and could not reach; or None. Here,
    so that the tool layer reaches the internet's module through the owner of calls."""
    from ..network.internet import proxy_notes

    return proxy_notes(state, since, pid)


def limit_warnings(held: Holding, place: Place) -> list[str]:
    """One line for each limit that this machine holds through no cgroup, with how it holds and what to do."""
    names = {"memory": "memory", "pids": "tasks", "cpu": "cpu"}
    how = {"memory": "holds for each process alone (RLIMIT_DATA)", "tasks": "holds for the call (RLIMIT_NPROC)",
           "cpu": "holds as CPU time for each process, not as a cap (RLIMIT_CPU)"}

    def held_how(name: str) -> str:
        return how[name] if name in held.by_rlimit else "does not hold"

    from ..sandboxing.fallback import PER_CALL  # loaded already: `held` is its

    # A limit that holds for the call (a cgroup's; tasks through its rlimit, doctor's "ok") needs no fix.
    return [f"the per-call {names[controller]} limit {held_how(names[controller])} here "
            f"({place.missing.get(controller, 'no cgroup')}): run {typed('doctor')} for the fix"
            for controller in held.limits.controllers() if held.holds(names[controller]) != PER_CALL]

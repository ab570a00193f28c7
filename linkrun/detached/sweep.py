"""Recovery after a crash (`sweep`), the agent stopping (`stop`), and the
agent's removal (`remove`), each of an agent given by its folder (`--agent`,
as `up` takes it) or by its state folder (`--state`).

A record's lock that a sweep can take means its supervisor is gone: the
kernel released the flock however it died. Each command here is safe at any
time, twice, or beside a running serve or sweep.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import time

from .. import logger
from .. import agent as agent_folder
from ..state import filing, layout, records
from ..messages import telling
from ..messages.wayin import DeliveryOutcome  # the sweep tells: it loads the sender anyway
from ..state.records import State, Told
from .outread import last_bytes, measure
from ..config import split_flags, way_in_flags
from ..errors import LinkRunError, UsageError
from ..invocation import typed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..messages.wayin import OutcomeName
    from ..state.records import Record

STOP_WAIT = 10.0


def log(text: str) -> None:
    """What a sweep did: said where a person reads it, quiet in serve's stderr (logger.py)."""
    logger.info(text)


# -- sweep ----------------------------------------------------------------------


def main_sweep(argv: list[str]) -> int:
    logger.start("sweep", quiet_for_a_client=True)  # serve starts one every few minutes, on its own stderr
    positional = None
    if argv and not argv[0].startswith("--"):
        positional, argv = argv[0], argv[1:]
    flags, _ = split_flags(argv, {"--state", "--way-in", "--as", "--keyring"}, set(), set())
    given = flags.get("--state") or positional
    if not given:
        raise UsageError("sweep needs the state folder", "lnk-link-run sweep <state> [--way-in A --as ID [--keyring DIR]]")
    way_in = way_in_flags(flags, os.environ)
    override = None
    if way_in.address is not None:
        override = telling.WayIn(way_in.address, way_in.agent, way_in.keyring)
    state = _checked_state(os.path.abspath(str(given)), "sweep")
    if state is None:
        return 0  # an agent's state folder not made yet: nothing to mend
    counts = sweep(state, override)
    return 1 if counts["failed"] else 0


def sweep(state: str, override: telling.WayIn | None = None) -> dict[str, int]:
    """One pass over the state folder; returns counts, for tests and logs.

    A record that fails is named and the pass goes on to the next.
    """
    counts = {"ended": 0, "told": 0, "removed": 0, "set aside": 0, "failed": 0}
    if not os.path.isdir(state):
        return counts
    try:
        with filing.hold(os.path.join(state, layout.SWEEP_LOCK), wait=0):
            sweep_all(state, override, counts)
    except FileNotFoundError:
        return counts  # removed meanwhile
    except filing.Held:
        return counts  # another sweep runs
    return counts


def sweep_all(state: str, override: telling.WayIn | None, counts: dict[str, int]) -> None:
    """The pass itself, under sweep.lock."""
    reachable = [True]  # one unreachable way in stops the telling for this run
    names = os.listdir(state)
    for name in names:
        command_id = name[:-5]
        if name.endswith(layout.RECORD) and records.ID.fullmatch(command_id):
            try:
                sweep_record(state, command_id, override, reachable, counts, names)
            except Exception as problem:  # noqa: BLE001 - one record must not stop the others
                counts["failed"] += 1
                logger.error(f"{command_id}: cannot sweep it: {problem!r}")
    remove_orphan_locks(state)


def sweep_record(state: str, command_id: str, override: telling.WayIn | None = None,
                 reachable: list[bool] | None = None, counts: dict[str, int] | None = None,
                 names: list[str] | None = None) -> None:
    """Mend one record whose supervisor is gone; nothing when its lock is held."""
    counts = counts if counts is not None else {"ended": 0, "told": 0, "removed": 0, "set aside": 0, "failed": 0}
    reachable = reachable if reachable is not None else [True]
    fd = records.try_lock(state, command_id)
    if fd is None:
        wake_if_backing_off(state, command_id, override)
        return
    try:
        try:
            record = records.load_strict(state, command_id)
        except records.BadRecord as bad:
            set_aside(state, command_id, str(bad))
            counts["set aside"] += 1
            return
        if record is None:
            return
        if record["state"] in records.RUNNING_STATES:
            end_abandoned(state, record)
            counts["ended"] += 1
        if record.get("told") in records.TO_TELL and reachable[0]:
            outcome = tell(state, record, override)
            if outcome == DeliveryOutcome.TOLD:
                counts["told"] += 1
            elif outcome == DeliveryOutcome.NOT_REACHED:
                reachable[0] = False
        if record.get("told") in records.SETTLED and expired(state, record):
            remove_files(state, record, names)
            counts["removed"] += 1
    finally:
        os.close(fd)


def wake_if_backing_off(state: str, command_id: str, override: telling.WayIn | None) -> None:
    """A supervisor that holds its lock while it backs off from an unreachable
    way in: a wake file makes it try again at once (once a Retry-After ends),
    at the way in this sweep was given (the bridge runs a sweep as it starts, perhaps on a new address)."""
    record = records.load(state, command_id)
    if not isinstance(record, dict):
        return
    if record.get("state") in records.RUNNING_STATES:
        if not record.get("lines_batch"):
            return  # running, with no tell_on message waiting for the way in
    elif record.get("told") != Told.UNTOLD or record.get("first_try") is None:
        return
    way_in = override or telling.WayIn.of(record)
    telling.write_wake(state, command_id, way_in)
    log(f"{command_id}: its supervisor is backing off: woken to try {way_in.address} at once "
        "(or once a Retry-After the way in gave it ends)")


def set_aside(state: str, command_id: str, why: str) -> None:
    """A bad record (we hold its lock): its files into `bad/`, named, and its lock removed."""
    where = records.set_aside(state, command_id)
    _unlink(layout.path(state, command_id, layout.LOCK))
    logger.warning(f"{command_id}: its record is not whole ({why}): set aside as {where}; its output, if any, "
                   f"stays in {layout.shown_output(command_id)} of the files folder ({typed('doctor')} names both)")


def remove_orphan_locks(state: str) -> None:
    """`<id>.lock` files with no record, which a start cut short left.

    Under start.lock, which a start holds from creating a lock to writing its
    record; and only a lock whose flock is free.
    """
    try:
        with filing.hold(os.path.join(state, layout.START_LOCK), wait=0):
            for name in os.listdir(state):
                command_id = name[:-5]
                if name.endswith(layout.LOCK) and records.ID.fullmatch(command_id) and \
                        not os.path.exists(layout.path(state, command_id, layout.RECORD)):
                    _remove_if_free(layout.path(state, command_id, layout.LOCK))
    except filing.Held:
        return  # a start is under way: next time
    except OSError:
        return


def _remove_if_free(lock_path: str) -> None:
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return  # held: a start that the guard does not cover, or a stranger's
    try:
        os.unlink(lock_path)
        log(f"{os.path.basename(lock_path)}: removed, a lock with no record")
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def end_abandoned(state: str, record: Record) -> None:
    """A record whose supervisor died: `starting` never ran, `running` was
    lost, with the bytes its output file holds."""
    if record["state"] == State.STARTING:
        record.update({"state": State.FAILED_TO_START, "ended": records.now()})
    else:
        kill_if_own(record)
        record.update({"state": State.LOST, "ended": last_sign_of_life(state, record)})
    measured = measure(record)
    if measured is not None:
        inode, kept_from, size = measured
        record.update({"inode": inode, "kept_from": kept_from, "bytes": kept_from + size})
    if record.get("told") != Told.NO_WAY_IN:
        record["told"] = Told.UNTOLD
    records.write(state, record["id"], record)
    log(f"{record['id']}: its supervisor is gone: {record['state']}")


def kill_if_own(record: Record) -> None:
    """Kill what is left of its sandbox only when it is surely its own: the
    same boot, and the recorded processes the same (a pid reused by a stranger
    is never signalled)."""
    if record.get("boot_id") != records.boot_id():
        return  # another boot: those numbers mean other processes now
    group, leader = record.get("group"), record.get("leader_pid")
    start = records.process_start(leader) if leader else None
    if group and leader and (start is None or start == record.get("leader_start")):
        try:
            os.killpg(group, signal.SIGKILL)
            log(f"{record['id']}: killed what was left of group {group}")
        except ProcessLookupError:
            pass
    # The sandbox's init is not in that group (it leads a session of its own),
    # and a program that traced it may have cut it loose from the group's end.
    init = record.get("init_pid")
    if init and record.get("init_start") is not None and records.process_start(init) == record["init_start"]:
        try:
            os.kill(init, signal.SIGKILL)
            log(f"{record['id']}: killed its sandbox's init, {init}")
        except ProcessLookupError:
            pass
    end_cgroup(record)


def end_cgroup(record: Record) -> None:
    """Its cgroup, as a whole: whatever is left in it, and the group itself."""
    if cgroup := record.get("cgroup"):
        from ..sandboxing.cgroups import Group

        group = Group.of_record(cgroup)
        left = group.members()
        record["limit"] = group.limit_hit()
        removed = group.remove()
        log(f"{record['id']}: ended its cgroup ({len(left)} left in it){'' if removed else ', which stays busy'}")


def last_sign_of_life(state: str, record: Record) -> float:
    times = []
    for where in (layout.path(state, record["id"], layout.RECORD),
                  os.path.join(record["files"], layout.BACKGROUND, layout.output_name(record["id"]))):
        try:
            times.append(os.stat(where, follow_symlinks=False).st_mtime)
        except OSError:
            pass
    return min(max(times), records.now()) if times else records.now()


def tell(state: str, record: Record, override: telling.WayIn | None) -> OutcomeName:
    """A sweep's attempt, in its own ten-minute window."""
    now = records.now()
    first_try = record.get("sweep_first_try")
    if first_try is None or first_try > now:  # or dated by a clock ahead
        first_try = record["sweep_first_try"] = now
    way_in = override or telling.WayIn.of(record)
    delivery = telling.tell_once(state, record, way_in, lambda text: log(f"{record['id']}: {text}"), last_bytes)
    if delivery.outcome == DeliveryOutcome.NOT_REACHED and now - min(first_try, now) >= telling.WINDOW:
        record["told"] = Told.GIVEN_UP
        records.write(state, record["id"], record)
        logger.warning(f"{record['id']}: the way in stayed unreachable for ten minutes of sweeps: given up")
        return DeliveryOutcome.GIVEN_UP
    return delivery.outcome


def expired(state: str, record: Record) -> bool:
    """Whether a record is past its keep. An end dated in the future was
    written while the wall clock was ahead: the sweep that first sees it
    dates it now, in the record, and it is kept from then (the caller holds
    the record's lock)."""
    ended = record.get("ended")
    if ended is None:
        return False
    now = records.now()
    if ended > now:
        ended = record["ended"] = now
        records.write(state, record["id"], record)
    return ended + record.get("keep", 0) <= now


def remove_files(state: str, record: Record, names: list[str] | None = None) -> None:
    """A record's files, its output, then its lock last (the caller holds it).

    `names` is the state folder's listing, when the caller has one.
    """
    command_id = record["id"]
    # Every file of it: the record, its input, log and stop file, and what a
    # write cut short left beside them (`<id>.json.<random>.tmp`).
    for name in names if names is not None else os.listdir(state):
        if name.startswith(command_id + ".") and name != command_id + layout.LOCK:
            _unlink(os.path.join(state, name))
    try:
        from .outread import open_background

        folder = open_background(record["files"])
    except OSError:
        folder = None
    if folder is not None:
        for name in (layout.output_name(command_id), layout.next_output_name(command_id)):
            try:
                os.unlink(name, dir_fd=folder)
            except FileNotFoundError:
                pass
        os.close(folder)
    _unlink(layout.path(state, command_id, layout.LOCK))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# -- stop and remove --------------------------------------------------------------


def stop_all(state: str, reason: str) -> list[str]:
    """Stop files for every running command; wait until each supervisor has
    exited (a command stopped this way ends lost and is not told now, so its
    supervisor exits right after recording the end)."""
    running = records.running_ids(state)
    for command_id in running:
        records.write_stop(state, command_id, reason)
    deadline = time.monotonic() + STOP_WAIT
    for command_id in running:
        while time.monotonic() < deadline:
            if not records.is_held(state, command_id):
                break
            time.sleep(0.005)  # the supervisors end within the 2 s of their TERM-then-KILL
    return running


AGENT_PARTS = ("Files", "Config", "Agent", "State")  # an agent's folder holds them; a state folder never does


def _state_folder(argv: list[str], command: str) -> tuple[str | None, str]:
    """The state folder of --agent (its State/, as `up` finds it) or --state,
    checked before anything is stopped or removed, None when not made yet;
    and the folder looked at, for what is said."""
    flags, _ = split_flags(argv, {"--agent", "--state"}, set(), set())
    if "--agent" in flags and "--state" in flags:
        raise UsageError(f"{command} takes --agent or --state, not both", "give one")
    if "--state" in flags:
        state = os.path.abspath(str(flags["--state"]))
        return _checked_state(state, command), state
    if "--agent" not in flags and command == "remove":  # it deletes: the agent is named, never assumed
        raise UsageError(f"{command} needs the agent it deletes the state of: --agent <folder> (the folder up was "
                         "given) or --state <dir> (its state folder)")
    # stop, as up and doctor: the default agent's folder unless one is given.
    given = str(flags["--agent"]) if "--agent" in flags else agent_folder.default_root(os.environ)
    folder = agent_folder.locate(given)
    if "--agent" not in flags and not os.path.isdir(folder.root):
        return None, f"the default agent's folder {folder.root}"  # not made yet: nothing of it runs
    if not os.path.isdir(folder.root):
        raise LinkRunError(f"--agent {folder.root}: no such folder", "give the agent's folder, as up was given it")
    if not any(os.path.isdir(os.path.join(folder.root, part)) for part in AGENT_PARTS):
        # Its State/ given, say: a state folder holds none of an agent's parts.
        raise LinkRunError(f"{folder.root} is not an agent's folder (it holds no Files/, Config/, Agent/ or State/)",
                           f"give the folder up was given: {typed(command)} --agent {os.path.dirname(folder.root)}"
                           if os.path.basename(folder.root) == "State" else "give the folder up was given as --agent")
    return (folder.state if os.path.isdir(folder.state) else None), folder.root


def _checked_state(state: str, command: str) -> str | None:
    """An agent's folder given for its state folder is refused (`remove`
    would delete the agent's files), and so is a folder that does not exist,
    unless it is the state folder of an agent's folder (removed already, or
    not made yet: None, nothing to do)."""
    if any(os.path.isdir(os.path.join(state, part)) for part in AGENT_PARTS):
        raise LinkRunError(f"{state} is an agent's folder, not its state folder",
                           f"give its state folder: lnk-link-run {command} --state {os.path.join(state, 'State')} "
                           f"(or the agent's folder: --agent {state})")
    if os.path.isdir(state):
        return state
    parent = os.path.dirname(state)
    if os.path.basename(state) == "State" and any(os.path.isdir(os.path.join(parent, p)) for p in AGENT_PARTS):
        return None
    raise LinkRunError(f"--state {state}: no such folder",
                       "give the agent's state folder: State/ in the agent's folder")


def main_stop(argv: list[str]) -> int:
    state, where = _state_folder(argv, "stop")
    if state is None:
        logger.info(f"no state folder in {where}: no background command of it runs (--agent names another agent)")
        return 0
    stopped = stop_all(state, records.AGENT_STOPPING)
    logger.info(f"stopped {len(stopped)} background command(s) of {where}; they are lost, and with a way in told "
                "so when the agent is back")
    return 0


def main_remove(argv: list[str]) -> int:
    state, _ = _state_folder(argv, "remove")
    if state is None:
        logger.info("no state folder: removed already, or never made")
        return 0
    # Under start.lock: no start can slip in between the mark and the stop.
    with filing.hold(os.path.join(state, layout.START_LOCK)), open(os.path.join(state, layout.REMOVED), "w") as f:
        f.write(f"{records.now():.3f}\n")
    # As the agent stopping: they end lost and untold, and no supervisor
    # lingers telling an agent that is going away.
    stopped = stop_all(state, records.AGENT_STOPPING)
    commands = records.ids(state)
    for command_id in commands:
        fd = records.try_lock(state, command_id)
        if fd is None:
            continue  # its supervisor still ends: its files go with the folder
        try:
            record = records.load(state, command_id)
            if record:
                remove_files(state, record)
        finally:
            os.close(fd)
    shutil.rmtree(state, ignore_errors=True)
    if os.path.exists(state):
        raise LinkRunError(f"{state} could not be removed whole: {', '.join(sorted(os.listdir(state))[:5])} "
                           "remain", "remove them by hand, or run remove again")
    # A serve of this agent that still runs answers its next calls that its state folder is gone.
    logger.info(f"removed {state}: stopped {len(stopped)} background command(s), removed the records of "
                f"{len(commands)} with their output; a server of this agent that still runs refuses its calls "
                "until it is started again")
    return 0

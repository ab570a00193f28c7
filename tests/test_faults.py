"""Faults of the output and the records: full disks (real small tmpfs
mounts), corrupt records, killed supervisors and fast rotations, with real
servers, supervisors and sweeps (through a pass-through sandbox)."""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from background_helpers import META, background_argv, payload, read, record, start, wait_ended, wait_running
from conftest import parent_of, SERVER, stop_what_runs, text_of, wait_for

from linkrun.state import records
from linkrun.messages import told

LINE = 16  # seq -f '%015.0f' prints 15 digits and a newline


@pytest.fixture
def faults():
    """Small tmpfs mounts and the state folders of a test; at the end, what
    still runs is stopped, then the mounts go."""
    class Faults:
        mounts: list[Path] = []
        states: list[Path] = []

        def mount(self, where: Path, size: str) -> Path:
            where.mkdir(parents=True, exist_ok=True)
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()})")
            self.mounts.append(where)
            return where

        def state(self, where: Path) -> Path:
            self.states.append(where)
            return where

    made = Faults()
    made.mounts, made.states = [], []
    yield made
    for state in made.states:
        stop_what_runs(state)
    for where in made.mounts:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(path: Path, size: int | None = None) -> Path:
    """Write a filler of `size` bytes, or until its disk is full."""
    chunk = b"f" * 65536
    with open(path, "wb", buffering=0) as f:
        written = 0
        while size is None or written < size:
            try:
                written += f.write(chunk if size is None else chunk[:min(len(chunk), size - written)])
            except OSError as error:
                if error.errno != errno.ENOSPC or size is not None:
                    raise
                break
    return path


def numbered_lines_at(offset: int, data: bytes) -> bool:
    """Whether `data` are the bytes at `offset` of seq -f '%015.0f' 0 …"""
    first, last = offset // LINE, (offset + len(data)) // LINE + 1
    expected = b"".join(b"%015d\n" % n for n in range(first, last + 1))
    skip = offset % LINE
    return data == expected[skip:skip + len(data)]


def sweep(state: Path) -> subprocess.CompletedProcess:
    return subprocess.run(SERVER + ["sweep", str(state)], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def work_folder(files: Path) -> Path:
    (files / "work").mkdir(exist_ok=True)
    return files


# -- 1. a full files disk ----------------------------------------------------------


def test_reads_while_the_files_disk_fills_and_frees_are_never_at_another_offset(servers, faults, tmp_path):
    files = work_folder(faults.mount(tmp_path / "files", "2m"))
    state = faults.state(tmp_path / "state")
    filler = fill(files / "filler", 1536 * 1024)
    server = servers(background_argv(files, state))
    server.initialize()
    progress = tmp_path / "progress"
    command_id = start(server, program="sh", args=["-c", (
        "i=0; while [ $i -lt 300 ]; do seq -f '%015.0f' $((i*1000)) $((i*1000+999)); "
        f"echo $i > {progress}; i=$((i+1)); sleep 0.02; done")])

    def lines_printed() -> int:
        try:
            return int(progress.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    phase, full_at, checked, wrong = "filling", 0, 0, []
    while True:
        value, text = read(server, id=command_id)
        data = payload(value, text)
        if data:
            checked += 1
            if not numbered_lines_at(value["offset"], data):
                wrong.append((value["offset"], data[:LINE]))
        disk = os.statvfs(files)
        if phase == "filling" and disk.f_bavail * disk.f_bsize < 160 * 1024:  # full within a few lines more
            phase, full_at = "full", lines_printed()
        elif phase == "full" and lines_printed() >= full_at + 25:  # the disk stayed full a while
            filler.unlink()
            phase = "freed"
        if value["state"] not in records.RUNNING_STATES:
            break
        time.sleep(0.05)  # a reader's pace
    assert phase == "freed", "the disk never filled"
    assert not wrong, f"{len(wrong)} of {checked} reads were of bytes from another offset: {wrong[:3]}"
    ended = wait_ended(state, command_id)
    assert (ended["state"], ended["exit"], ended["bytes"]) == ("exited", 0, 300 * 1000 * LINE)
    assert ended["dropped"] > 0


# -- 2. a rotation on a full disk ------------------------------------------------------


def test_a_rotation_on_a_full_disk_goes_on_and_says_what_it_dropped(servers, faults, tmp_path):
    files = work_folder(faults.mount(tmp_path / "files", "2m"))
    state = faults.state(tmp_path / "state")
    fill(files / "filler", 700 * 1024)
    server = servers(background_argv(files, state, output="512K"))
    server.initialize()
    command_id = start(server, program="sh", args=["-c", "seq -f '%015.0f' 0 199999"])
    ended = wait_ended(state, command_id, timeout=60)
    assert (ended["state"], ended["exit"], ended["bytes"]) == ("exited", 0, 200000 * LINE), \
        (state / f"{command_id}.log").read_text()
    assert not (files / "background" / f"{command_id}.out.next").exists()
    kept = (files / "background" / f"{command_id}.out").read_bytes()
    assert ended["kept_from"] + len(kept) == ended["bytes"]
    assert numbered_lines_at(ended["kept_from"], kept)
    assert ended["dropped"] > 0
    value, text = read(server, id=command_id, offset=0)
    assert "the disk was full" in text and value["dropped"] == ended["dropped"]
    assert "disk" in (state / f"{command_id}.log").read_text()


# -- 3. a full state folder ---------------------------------------------------------------


def test_a_command_ending_while_the_state_folder_is_full_keeps_its_end(servers, faults, tmp_path, files):
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    state = faults.state(faults.mount(tmp_path / "state", "2m"))
    server = servers(background_argv(files, state))
    server.initialize()
    command_id = start(server, program="sh", args=["-c", "sleep 2; echo done; exit 3"])
    wait_running(state, command_id)
    tried = threading.Event()

    class RecordWrites(FileSystemEventHandler):
        def on_created(self, event):
            if os.path.basename(event.src_path).startswith(f"{command_id}.json.") and event.src_path.endswith(".tmp"):
                tried.set()

    observer = Observer()
    observer.schedule(RecordWrites(), str(state), recursive=False)
    observer.start()
    try:
        filler = fill(state / "filler")
        assert tried.wait(30), "the supervisor never tried to record the end"
    finally:
        observer.stop()
        observer.join()
    # While it is full: list answers, and says it runs (its end is not recorded yet).
    listed = server.call("list", {}, meta=META)
    assert "isError" not in listed, text_of(listed)
    assert listed["structuredContent"]["commands"][0]["state"] in records.RUNNING_STATES, text_of(listed)
    filler.unlink()

    def listed_end():
        entry = server.call("list", {}, meta=META)["structuredContent"]["commands"][0]
        return entry["state"] not in records.RUNNING_STATES and entry

    ended = wait_for(listed_end, timeout=20, interval=0.1, what="the end in list")
    assert (ended["state"], ended["exit"], ended["bytes"]) == ("exited", 3, 5)


# -- 4. corrupt records ------------------------------------------------------------------------


def corrupt(state: Path, command_id: str, how: str) -> bytes:
    path = state / f"{command_id}.json"
    good = path.read_bytes()
    bad = {"list": b"[1, 2]", "empty object": b"{}", "no state": good.replace(b'"state"', b'"stat"'),
           "truncated": good[:40]}[how]
    path.write_bytes(bad)
    return bad


@pytest.mark.parametrize("how", ["list", "empty object", "no state", "truncated"])
def test_a_corrupt_record_is_set_aside_and_named_and_the_rest_goes_on(servers, files, faults, tmp_path, how):
    state = faults.state(tmp_path / "state")
    server = servers(background_argv(files, state))
    server.initialize()
    broken = start(server, program="sh", args=["-c", "echo broken"])
    fine = start(server, program="sh", args=["-c", "echo fine"])
    wait_ended(state, broken)
    wait_ended(state, fine)
    abandoned = start(server, program="sleep", args=["100"])
    supervisor = parent_of(wait_running(state, abandoned)["leader_pid"])
    wait_for(lambda: not records.is_held(str(state), broken), what="the supervisor of the broken one to exit")
    bad = corrupt(state, broken, how)
    os.kill(supervisor, signal.SIGKILL)
    wait_for(lambda: not records.is_held(str(state), abandoned), what="the killed supervisor's lock to be free")

    # Every tool of the conversation still works.
    for name, arguments in (("list", {}), ("read", {"id": fine}), ("stop", {"id": fine}),
                            ("start", {"program": "true"})):
        result = server.call(name, arguments, meta=META)
        assert "isError" not in result, f"{name}: {text_of(result)}"
    unknown = server.call("read", {"id": broken}, meta=META)
    assert unknown.get("isError") and "no command" in text_of(unknown)

    # A sweep sets it aside, names it, and sweeps the others.
    done = sweep(state)
    assert done.returncode == 0, done.stderr
    assert broken in done.stderr and "set aside" in done.stderr
    assert (state / "bad" / f"{broken}.json").read_bytes() == bad
    assert not (state / f"{broken}.json").exists() and not (state / f"{broken}.lock").exists()
    assert record(state, abandoned)["state"] == "lost"


def test_a_record_that_is_not_whole_loads_as_none_and_a_good_one_loads(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    good = (Path(__file__).parent / "data" / "record-v1.json").read_bytes()
    command_id = "nnfy7ok7joavl2do"
    (state / f"{command_id}.json").write_bytes(good)
    assert records.load(str(state), command_id)["state"] == "exited"
    for bad in (b"[1, 2]", b"{}", b"null", good[:40], good.replace(b'"thread": "t1"', b'"thread": 7')):
        (state / f"{command_id}.json").write_bytes(bad)
        assert records.load(str(state), command_id) is None
        with pytest.raises(records.BadRecord):
            records.load_strict(str(state), command_id)


def test_doctor_names_bad_records(tmp_path):
    root = tmp_path / "agent"
    (root / "State" / "bad").mkdir(parents=True)
    (root / "State" / "bad" / "aaaaaaaaaaaaaaaa.json").write_bytes(b"{}")
    (root / "State" / "bbbbbbbbbbbbbbbb.json").write_bytes(b"[1, 2]")
    done = subprocess.run(SERVER + ["doctor", "--agent", str(root)], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert "aaaaaaaaaaaaaaaa" in done.stdout and "set aside" in done.stdout, done.stdout + done.stderr
    assert "bbbbbbbbbbbbbbbb" in done.stdout and "sweep" in done.stdout, done.stdout


# -- 5. a lost command's bytes ------------------------------------------------------------------


def test_a_lost_command_is_told_the_bytes_its_output_holds(servers, files, faults, tmp_path):
    state = faults.state(tmp_path / "state")
    server = servers(background_argv(files, state))
    server.initialize()
    command_id = start(server, program="sh", args=["-c", "echo important-output-line; seq 1 1000; sleep 60"])
    output = files / "background" / f"{command_id}.out"
    wait_for(lambda: output.exists() and output.stat().st_size == 3915, what="the output")
    os.kill(parent_of(wait_running(state, command_id)["leader_pid"]), signal.SIGKILL)
    wait_for(lambda: not records.is_held(str(state), command_id), what="the lock to be free")
    done = sweep(state)
    assert done.returncode == 0, done.stderr
    lost = record(state, command_id)
    assert (lost["state"], lost["bytes"], lost["kept_from"]) == ("lost", 3915, 0)
    assert "printed 3915 bytes" in told.told_text(lost, output.read_bytes())
    entry = server.call("list", {}, meta=META)["structuredContent"]["commands"][0]
    assert entry["bytes"] == 3915


# -- 6. fast rotation -----------------------------------------------------------------------------


def test_reads_and_list_hold_under_fast_rotation(servers, files, faults, tmp_path):
    state = faults.state(tmp_path / "state")
    server = servers(background_argv(files, state, output="64K"))
    server.initialize()
    ids = [start(server, program="sh", args=["-c", "seq -f '%015.0f' 0 1500000"]) for _ in range(2)]
    failures, wrong, backwards = [], [], []
    done = threading.Event()

    # A server for each thread: one client speaks to its server one call at a time.
    readers = [servers(background_argv(files, state, output="64K")) for _ in range(4)]
    listing = servers(background_argv(files, state, output="64K"))
    for each in (*readers, listing):
        each.initialize()

    def reader(server, command_id: str):
        while not done.is_set():
            result = server.call("read", {"id": command_id}, meta=META)
            if result.get("isError"):
                failures.append(text_of(result))
                continue
            value = result["structuredContent"]
            data = payload(value, text_of(result))
            if data and not numbered_lines_at(value["offset"], data):
                wrong.append(value["offset"])

    def lister():
        seen: dict[str, int] = {}
        while not done.is_set():
            for entry in listing.call("list", {}, meta=META)["structuredContent"]["commands"]:
                if entry["bytes"] < seen.get(entry["id"], 0):
                    backwards.append((entry["id"], seen[entry["id"]], entry["bytes"]))
                seen[entry["id"]] = entry["bytes"]

    threads = [threading.Thread(target=reader, args=(readers[i], ids[i % 2])) for i in range(4)]
    threads.append(threading.Thread(target=lister))
    for thread in threads:
        thread.start()
    try:
        for command_id in ids:
            wait_ended(state, command_id, timeout=120)
    finally:
        done.set()
        for thread in threads:
            thread.join()
    assert not failures, f"{len(failures)} reads failed: {failures[0]}"
    assert not wrong and not backwards, (wrong[:3], backwards[:3])


# -- 7. locks left by a refused start ---------------------------------------------------------------


def test_a_start_refused_on_a_full_state_folder_says_so_and_leaves_no_lock(servers, files, faults, tmp_path):
    state = faults.state(faults.mount(tmp_path / "state", "2m"))
    server = servers(background_argv(files, state))
    server.initialize()
    wait_ended(state, start(server, program="true"))
    # A command's lock is `<id>.lock`; serve's first sweep may make `sweep.lock` meanwhile.
    locks = set(state.glob("????????????????.lock"))
    filler = fill(state / "filler")
    for _ in range(3):
        result = server.call("start", {"program": "true"}, meta=META)
        assert result.get("isError") is True
        assert "state folder" in text_of(result) and "space" in text_of(result), text_of(result)
    assert set(state.glob("????????????????.lock")) == locks
    filler.unlink()
    assert "isError" not in server.call("start", {"program": "true"}, meta=META)


def test_a_sweep_removes_a_lock_with_no_record_and_keeps_a_held_one(files, faults, tmp_path):
    state = faults.state(tmp_path / "state")
    state.mkdir()
    orphan, held = state / "aaaaaaaaaaaaaaaa.lock", state / "bbbbbbbbbbbbbbbb.lock"
    orphan.touch()
    held.touch()
    with open(held) as holding:
        fcntl.flock(holding, fcntl.LOCK_EX)
        done = sweep(state)
        assert done.returncode == 0, done.stderr
        assert not orphan.exists() and held.exists()

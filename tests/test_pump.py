"""The pump's output file at the kernel's level: a real OutputFile fed by a
real program through a real pipe, and what its rotations leave on the disk."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
from pathlib import Path

import pytest

from linkrun.state import layout, records
from linkrun.detached.outfile import OutputFile

CAP = 1 << 20
FS_IOC_FIEMAP = 0xC020660B
FIEMAP_EXTENT_DELALLOC = 0x4
EXTENTS = 64  # room for that many in one FIEMAP answer


def extent_flags(path: Path) -> list[int]:
    """The flags of each extent of a file, as the filesystem maps it now (FIEMAP, no sync)."""
    header = struct.pack("QQIIII", 0, 2**64 - 1, 0, 0, EXTENTS, 0)
    answer = bytearray(header + bytes(56 * EXTENTS))
    with open(path, "rb") as f:
        fcntl.ioctl(f.fileno(), FS_IOC_FIEMAP, answer)
    count = struct.unpack_from("I", answer, 20)[0]
    return [struct.unpack_from("I", answer, 32 + 56 * index + 40)[0] for index in range(count)]


def delays_allocation(folder: Path) -> bool:
    """Whether a fresh write here stays in memory, its blocks not yet chosen (ext4's delalloc)."""
    probe = folder / "probe"
    probe.write_bytes(bytes(CAP))
    try:
        flags = extent_flags(probe)
    except OSError:
        return False  # no FIEMAP here
    finally:
        probe.unlink()
    return bool(flags) and all(flag & FIEMAP_EXTENT_DELALLOC for flag in flags)


def pump_through(files: Path, size: int) -> tuple[OutputFile, list[dict]]:
    """`head -c size /dev/zero` pumped into a new output file rotating at twice CAP, then finished."""
    rotations: list[dict] = []
    output = OutputFile.create(str(files), records.new_id(), CAP, on_rotate=rotations.append)
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    program = subprocess.Popen(["head", "-c", str(size), "/dev/zero"], stdout=write_end)
    os.close(write_end)
    try:
        while output.pump(read_end):
            pass
    finally:
        os.close(read_end)
        program.wait()
    return output, rotations


def pipe_through(write_end: int, read_end: int, output: OutputFile, data: bytes) -> None:
    """Each piece the pipe holds (64 KiB, its least size) written, then pumped."""
    for at in range(0, len(data), 1 << 16):
        os.write(write_end, data[at:at + (1 << 16)])
        output.pump(read_end)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "files" / layout.BACKGROUND).mkdir(parents=True)
    return tmp_path / "files"


def test_a_rotation_leaves_the_kept_half_in_memory_not_forced_to_disk(files: Path) -> None:
    # A rotation renamed the copy over the old file; on ext4 a rename over a
    # file writes the new one to disk at once, though the next rotation frees it.
    background = files / layout.BACKGROUND
    if not delays_allocation(background):
        pytest.skip("this filesystem chooses blocks at each write (no delayed allocation to keep)")
    output, rotations = pump_through(files, 2 * CAP + 4096)
    name = background / output.name
    try:
        assert len(rotations) == 1
        flags = extent_flags(name)
        assert flags and all(flag & FIEMAP_EXTENT_DELALLOC for flag in flags), \
            f"the kept half went to disk at the rotation: extent flags {[hex(flag) for flag in flags]}"
    finally:
        output.finish()


def test_rotations_leave_one_file_with_the_newest_bytes(files: Path) -> None:
    output, rotations = pump_through(files, 5 * CAP + 123)
    output.finish()
    # Four cuts at twice the cap; a fifth, finish's, when a read happened to
    # end right at the fourth's point and the last 123 bytes came after it.
    assert len(rotations) in (4, 5), rotations
    assert sorted(os.listdir(files / layout.BACKGROUND)) == [output.name]  # nothing swapped out is left
    assert os.stat(files / layout.BACKGROUND / output.name).st_size == CAP
    assert (output.total, output.kept_from) == (5 * CAP + 123, 4 * CAP + 123)
    assert os.stat(files / layout.BACKGROUND / output.name).st_ino == rotations[-1]["inode"]


def test_a_rotation_after_the_file_was_removed_by_hand_puts_the_kept_half_in_its_place(files: Path) -> None:
    rotations: list[dict] = []
    output = OutputFile.create(str(files), records.new_id(), CAP, on_rotate=rotations.append)
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        pipe_through(write_end, read_end, output, b"a" * CAP)
        os.unlink(files / layout.BACKGROUND / output.name)
        pipe_through(write_end, read_end, output, b"b" * CAP)  # at twice the cap: a rotation
    finally:
        os.close(write_end)
        os.close(read_end)
    output.finish()
    assert len(rotations) == 1
    assert (files / layout.BACKGROUND / output.name).read_bytes() == b"b" * CAP
    assert sorted(os.listdir(files / layout.BACKGROUND)) == [output.name]

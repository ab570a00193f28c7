"""Who connects to the agent's proxy: a peer's pid, the sandbox it belongs to
(what the per-sandbox cap counts by), and the processes above it (what a
refusal is logged with, so that each call is told only its own)."""

from __future__ import annotations

import asyncio
import fcntl
import functools
import os
import socket
import struct


def peer_pid(writer: asyncio.StreamWriter) -> int | None:
    sock = writer.get_extra_info("socket")
    try:
        pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except (OSError, AttributeError):
        return None
    return pid or None


NS_GET_PARENT = 0xB702  # ioctl: the pid namespace above this one (linux/nsfs.h)


@functools.cache
def _own_pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino  # the proxy never leaves it: read once


def sandbox_of(pid: int | None) -> str:
    """What the per-sandbox cap counts by: the pid namespace the connecting
    process is in (on the host's socket), or the one that holds it just below ours, so that namespaces
    a program makes inside count as its sandbox. Else its pid, else one
    bucket for peers already gone."""
    if pid is None:
        return "unknown peer"
    try:
        namespace = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return f"pid {pid}" if os.path.exists(f"/proc/{pid}") else "unknown peer"
    try:
        ours = _own_pid_namespace()
        while (found := os.fstat(namespace).st_ino) != ours:
            try:
                parent = fcntl.ioctl(namespace, NS_GET_PARENT)
            except OSError:  # above it lies none we can see
                break
            if os.fstat(parent).st_ino == ours:
                os.close(parent)
                break
            os.close(namespace)
            namespace = parent
        return f"pid namespace {found}"
    finally:
        os.close(namespace)


def ancestors(pid: int | None, depth: int = 12) -> list[int]:
    """`pid` and the processes above it, as far as /proc shows them."""
    found: list[int] = []
    while pid and pid > 1 and len(found) < depth:
        found.append(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rpartition(b")")[2].split()[1])  # after the name: state, ppid
        except (OSError, ValueError, IndexError):
            break
    return found

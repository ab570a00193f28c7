"""The calls' listeners reaching the proxy: handover.py's process started on
`proxy/hand.sock`, each listener it makes received with its sandbox's init,
and the process started again should it end (a proxy without it would give
no later call the internet, while the calls it serves keep theirs)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Callable

from .. import logger
from . import internet
from ..state import layout
from ..units import signal_name

BACKLOG = 256  # connections a listener queues before the proxy accepts them
RESTART_DELAY = 1.0  # seconds before a hand-over process that ended is started again: one that cannot start never spins

# What the proxy does with a call's listener: the listener, a pidfd of its sandbox's init, that init's pid.
Serve = Callable[[socket.socket, int, int], None]


class HandOver:
    """handover.py's process and our end of its channel."""

    def __init__(self, folder: str, serve: Serve):
        self.folder, self.serve = folder, serve
        self.pid: int | None = None
        self.channel: socket.socket | None = None

    def start(self) -> None:
        """Bind `hand.sock` afresh and start the process on it (ours closed
        once it has them); `watch()` then, in the proxy's loop."""
        hand = bind_unix(self.folder, layout.PROXY_HAND, socket.SOCK_SEQPACKET)
        channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.pid = _spawn(hand, theirs)
        except OSError:
            channel.close()
            raise
        finally:
            hand.close()
            theirs.close()
        channel.setblocking(False)
        self.channel = channel

    def watch(self) -> None:
        assert self.channel is not None, "start() first"
        asyncio.get_running_loop().add_reader(self.channel, self.received)

    def received(self) -> None:
        """A listener made in a sandbox, with that sandbox's init; or the end of the process."""
        assert self.channel is not None, "watched only while started"
        try:
            message, fds, _, _ = socket.recv_fds(self.channel, 64, 2)
        except (BlockingIOError, InterruptedError):
            return
        if not message and not fds:  # every holder of its end closed it: the process ended
            self.ended()
        elif len(fds) != 2 or not message.isdigit():
            for fd in fds:
                os.close(fd)
        else:
            self.serve(socket.socket(fileno=fds[0]), fds[1], int(message))

    def ended(self) -> None:
        assert self.channel is not None and self.pid is not None, "ends only once started"
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.channel)
        self.channel.close()
        self.channel = None
        try:
            os.kill(self.pid, signal.SIGKILL)  # gone already, or about to: the wait below cannot hang
        except ProcessLookupError:
            pass
        _, status = os.waitpid(self.pid, 0)
        logger.warning(f"the hand-over process ended ({_how(status)}); starting another in {RESTART_DELAY:g} s")
        loop.call_later(RESTART_DELAY, self.restart)

    def restart(self) -> None:
        try:
            self.start()
        except OSError as problem:
            logger.warning(f"cannot start the hand-over process: {problem}; trying again in {RESTART_DELAY:g} s")
            asyncio.get_running_loop().call_later(RESTART_DELAY, self.restart)
            return
        self.watch()


def bind_unix(folder: str, name: str, kind: int) -> socket.socket:
    """A listening Unix socket `folder/name`, made under a temporary name and
    renamed: a restarted proxy replaces the socket whole."""
    sock = socket.socket(socket.AF_UNIX, kind)
    temporary = f".{name}.{os.getpid()}"
    folder_fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        sock.bind(internet.short_path(folder_fd, temporary))
        os.chmod(temporary, 0o600, dir_fd=folder_fd)
        sock.listen(BACKLOG)
        os.rename(temporary, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    finally:
        os.close(folder_fd)
    return sock


def _spawn(hand: socket.socket, channel: socket.socket) -> int:
    """handover.py as a small process of its own (its forks are cheap); it dies with us."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "handover.py")
    for sock in (hand, channel):
        os.set_inheritable(sock.fileno(), True)
    return os.posix_spawn(sys.executable, [sys.executable, "-I", "-S", script, str(os.getpid()), str(hand.fileno()),
                                           str(channel.fileno()), str(internet.PORT), str(internet.HAND_TIMEOUT)],
                          os.environ)


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal_name(os.WTERMSIG(status))}"
    return f"exit {os.WEXITSTATUS(status)}"

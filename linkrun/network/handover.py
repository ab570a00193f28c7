"""The hand-over's far side: a call's listener made inside its sandbox's
network, for the agent's proxy.

Run by the proxy as

    python -I -S handover.py <proxy pid> <hand fd> <channel fd> <port> <timeout>

stdlib only, nothing of the package imported: a small process, so that its
forks are cheap. On `hand` (the listening socket `proxy/hand.sock`) serve or
a supervisor sends the pid of a sandbox's init and a pidfd of it
(internet.hand_over); a socket listening on 127.0.0.1:<port> in that
sandbox's network goes to the proxy on `channel`, with the pidfd (the proxy
serves the listener until the init ends), and the caller gets `ok`, or why
not.

How it enters a sandbox's network is chosen once, at the start:
- in place, where it may join a network from where it is (CAP_SYS_ADMIN in
  its own user namespace: root): it joins the sandbox's, makes the listener
  and comes back, no process made per call;
- by spares, for an ordinary user: only a member of the sandbox's user
  namespace may join its network, only a single-threaded process may join a
  user namespace, and none ever leaves it. So SPARES processes are forked
  ahead, each serving one hand-over and exiting, and another is forked for
  each that ended.
It dies with the proxy (a parent-death signal), and its spares with it.
"""

import ctypes
import errno
import os
import signal
import socket
import sys
from collections.abc import Callable

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000  # linux/sched.h
PR_SET_PDEATHSIG = 1
IP_FREEBIND = 15  # linux/in.h: bind before the sandbox's loopback is up
SPARES = 2  # processes forked ahead, each to make one sandbox's listener
BACKLOG = 256  # connections a listener queues before the proxy accepts them
NO_NETWORK = "the process handed over has no network of its own"

libc = ctypes.CDLL(None, use_errno=True)


class Hands:
    """The hand socket, the channel to the proxy, and what a listener needs."""

    def __init__(self, hand: socket.socket, channel: socket.socket, port: int, timeout: float):
        self.hand, self.channel, self.port, self.timeout = hand, channel, port, timeout
        self.home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self.host_network = os.fstat(self.home).st_ino

    def serve_one(self, make: Callable[[int], socket.socket]) -> None:
        """One hand-over: a pidfd of a sandbox's init (and its pid) in, the
        listener `make` made in that sandbox's network out to the proxy,
        `ok` (or why not) back to the caller."""
        try:
            caller, _ = self.hand.accept()
        except OSError:  # a caller that left while queued
            return
        with caller:
            caller.settimeout(self.timeout)
            try:
                message, fds, _, _ = socket.recv_fds(caller, 64, 1)
            except OSError:
                return
            if len(fds) != 1 or not message.isdigit():
                for fd in fds:
                    os.close(fd)
                _tell(caller, b"the hand-over is a pid and a pidfd of the sandbox's init")
                return
            try:
                self.refuse_the_host_network(fds[0])
                with make(fds[0]) as listener:
                    socket.send_fds(self.channel, [message], [listener.fileno(), fds[0]])
            except Exception as problem:  # the caller is told, whatever it was: its program waits for the answer
                _tell(caller, f"the agent's proxy cannot listen in the sandbox: {problem}".encode())
                return
            finally:
                os.close(fds[0])
            _tell(caller, b"ok")

    def refuse_the_host_network(self, pidfd: int) -> None:
        """Refuse, in words, a process in the host's network. Entering it
        cannot say so for an ordinary user: joining the user namespace we are
        in is EINVAL, and then its network EPERM, as for any process we may not
        enter. This look is for the words; listen_here's check, once in, is
        the one that holds."""
        try:
            with open(f"/proc/self/fdinfo/{pidfd}") as info:
                pid = next(int(line.split()[1]) for line in info if line.startswith("Pid:"))
            network = os.stat(f"/proc/{pid}/ns/net").st_ino
            # Its pid may have been reused since we read it: still alive, it was this process.
            signal.pidfd_send_signal(pidfd, 0)
        except (OSError, StopIteration, ValueError):
            return  # ended, or not ours to look at: entering it says why
        if network == self.host_network:
            raise OSError(errno.EINVAL, NO_NETWORK)

    def listen_in_place(self, pidfd: int) -> socket.socket:
        """Into the sandbox's network and back home: CAP_SYS_ADMIN here is enough."""
        _setns(pidfd, CLONE_NEWNET)
        try:
            return self.listen_here()
        finally:
            if libc.setns(self.home, CLONE_NEWNET) != 0:
                os._exit(1)  # never left in a sandbox's network: callers are told the proxy ended

    def listen_as_member(self, pidfd: int) -> socket.socket:
        """Into the sandbox's user namespace, then its network: for good (a spare)."""
        try:
            _setns(pidfd, CLONE_NEWUSER | CLONE_NEWNET)
        except OSError as problem:
            if problem.errno != errno.EINVAL:
                raise
            _setns(pidfd, CLONE_NEWNET)  # a sandbox in our own user namespace
        return self.listen_here()

    def listen_here(self) -> socket.socket:
        """127.0.0.1:port listening in the network we are in: never the host's own."""
        if os.stat("/proc/self/ns/net").st_ino == self.host_network:
            raise OSError(errno.EINVAL, NO_NETWORK)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            listener.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(BACKLOG)
        except BaseException:
            listener.close()
            raise
        return listener

    def in_place(self) -> bool:
        """Whether this process may join a network from where it is (rejoining its own tells)."""
        return bool(libc.setns(self.home, CLONE_NEWNET) == 0)


def _tell(caller: socket.socket, answer: bytes) -> None:
    try:
        caller.send(answer)
    except OSError:
        pass  # it left (a serve killed mid-call): the next caller is served all the same


def _setns(pidfd: int, namespaces: int) -> None:
    if libc.setns(pidfd, namespaces) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"cannot enter its namespaces: {os.strerror(error)}")


def _die_with(parent: int) -> bool:
    """Killed when `parent` ends; False when it ended already."""
    return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0 and os.getppid() == parent


def keep_spares(hands: Hands) -> None:
    """SPARES processes waiting on the hand socket, each serving one hand-over; another forked for each that ended."""
    maker = os.getpid()
    spares = 0
    while True:
        while spares < SPARES:
            if os.fork() == 0:
                try:
                    if _die_with(maker):
                        hands.serve_one(hands.listen_as_member)
                finally:
                    os._exit(0)
            spares += 1
        os.wait()
        spares -= 1


def main(argv: list[str]) -> int:
    proxy, hand, channel, port, timeout = int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4]), float(argv[5])
    if not _die_with(proxy):
        return 0
    hands = Hands(socket.socket(fileno=hand), socket.socket(fileno=channel), port, timeout)
    if hands.in_place():
        while True:
            hands.serve_one(hands.listen_in_place)
    keep_spares(hands)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

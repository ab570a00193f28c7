"""The agent's sandbox started once, as a call would, to check that it runs
here: in the files folder, unable to write it, /proc and /dev read-only, its
filter on. `up` starts it before serve answers its calls (front/checks.py),
and `doctor` reports it; a failure names the fix in one line.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import agent as agent_folder
from ..errors import LinkRunError
from ..invocation import typed
from . import sandbox
from .launch import Sandbox, prepare

if TYPE_CHECKING:  # subprocess where used: up's handshake needs none of it
    import subprocess

TROUBLESHOOTING = "docs/troubleshooting.md"


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def namespaces_hint() -> str:
    """What to do when the kernel refuses bubblewrap its namespaces, for the
    reason this machine most likely has."""
    if _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        return ("Ubuntu's AppArmor restricts user namespaces: give bwrap a profile that allows them "
                f"(see 'Namespaces refused' in {TROUBLESHOOTING}) "
                "or run: sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0")
    if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return "run: sudo sysctl kernel.unprivileged_userns_clone=1 (and set it in /etc/sysctl.d to keep it)"
    if _read("/proc/sys/user/max_user_namespaces") == "0":
        return "run: sudo sysctl user.max_user_namespaces=15000 (and set it in /etc/sysctl.d to keep it)"
    if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"):
        return ("this is a container that refuses user namespaces: run on the host, or start the "
                "container with user namespaces allowed (its seccomp and AppArmor profiles)")
    return f"allow unprivileged user namespaces (see 'Namespaces refused' in {TROUBLESHOOTING})"


_NAMESPACE_WORDS = ("namespace", "uid map", "unshare", "loopback", "Operation not permitted",
                    "Permission denied")


def probe(fixed: Sequence[str], folder: agent_folder.AgentFolder, write: Sequence[str],
          seccomp: str | None = None) -> None:
    """Start the agent's sandbox once, as a call would, and check that it ran
    in the files folder and cannot write it. Raises LinkRunError naming the fix."""
    start_probe(fixed, folder, write, seccomp).check()


class Probe:
    """A probe under way: `up` starts it, does other work, then checks it."""

    def __init__(self, process: subprocess.Popen[str], folder: agent_folder.AgentFolder, filtered: bool):
        self.process, self.folder, self.filtered = process, folder, filtered

    def check(self) -> None:
        import subprocess

        folder = self.folder
        try:
            stdout, stderr = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            raise LinkRunError("the sandbox did not start within 30 s",
                               f"run {typed('doctor')}; see {TROUBLESHOOTING}") from None
        error_line = next((line for line in stderr.splitlines() if line.strip()), "")
        not_visible = LinkRunError(
            f"the files folder {folder.files} is not visible inside the sandbox",
            "move the agent's folder (up --agent) to a place of its own, such as under your home, "
            "outside /usr, /proc, /dev and /etc")
        if self.process.returncode != 0:
            if folder.root in error_line:  # bwrap could not make or enter it (Can't mkdir, Can't chdir)
                raise LinkRunError(f"{not_visible.message} ({error_line})", not_visible.hint)
            if any(word in error_line for word in _NAMESPACE_WORDS):
                raise LinkRunError(f"the kernel refused the sandbox its namespaces ({error_line})", namespaces_hint())
            raise LinkRunError(f"the sandbox did not start ({error_line or f'exit {self.process.returncode}'})",
                               f"run {typed('doctor')}; see {TROUBLESHOOTING}")
        lines = stdout.splitlines()
        real = os.stat(folder.files)
        if lines[:2] != [folder.files, f"{real.st_dev}:{real.st_ino}"]:
            raise LinkRunError(f"{not_visible.message} (it ran in {lines[0] if lines else '?'})", not_visible.hint)
        if "writable" in lines[2:]:
            raise LinkRunError(f"the files folder {folder.files} is writable inside the sandbox",
                               "do not run the sandbox with capabilities; report this as a bug")
        if "proc-read-only" not in lines[2:]:
            raise LinkRunError("/proc, the kernel's settings among it, is writable inside the sandbox",
                               "update bubblewrap (--remount-ro needs 0.4 or later); report this as a bug")
        if "dev-read-only" not in lines[2:]:
            raise LinkRunError("/dev is writable inside the sandbox (a tmpfs of half the memory)",
                               "update bubblewrap (--remount-ro /dev needs 0.4 or later); report this as a bug")
        if "environ 0" not in lines[2:]:
            raise LinkRunError("the sandbox's init kept an environment, readable inside at /proc/1/environ",
                               "report this as a bug: bwrap must start with an empty environment")
        if self.filtered and not any(line.split() == ["Seccomp:", "2"] for line in lines[2:]):
            raise LinkRunError("the sandbox's syscall filter is not loaded inside",
                               "check that the kernel has seccomp (CONFIG_SECCOMP_FILTER); report this as a bug")


def start_probe(fixed: Sequence[str], folder: agent_folder.AgentFolder, write: Sequence[str],
                seccomp: str | None = None) -> Probe:
    sh = sandbox.find_system("sh")
    if sh is None:
        raise LinkRunError("no sh on the system PATH", "install a shell: the sandbox is checked with it")
    # The probe writes nothing when the files folder is read-only, as it must be.
    # `stat` tells the files folder itself from a folder of the same name
    # that bwrap made inside because the real one was not shown.
    # The rest reads, never writes, what no program may change: the mount of
    # /proc, bwrap's own environment (pid 1's), and the filter's mode.
    script = ("pwd -P; stat -L -c %d:%i .; if (: >.lnk-probe) 2>/dev/null; then rm -f .lnk-probe; echo writable; fi; "
              # the shell's builtins alone from here: each exec inside costs up's start
              "while read -r _ _ _ _ at options _; do [ \"$at\" = /proc ] && case $options in ro,*) "
              "echo proc-read-only;; esac; done < /proc/self/mountinfo; "
              "if (: >/dev/.lnk-probe) 2>/dev/null; then rm -f /dev/.lnk-probe; else echo dev-read-only; fi; "
              "if [ -s /proc/1/environ ]; then echo environ kept; else echo environ 0; fi; "
              "while read -r key value; do [ \"$key\" = Seccomp: ] && echo \"Seccomp: $value\"; done < /proc/self/status; true")
    import subprocess

    launch = prepare(Sandbox(tuple(fixed), folder.files, tuple(write), seccomp=seccomp), [sh, "-c", script],
                     watch_init=False)
    with launch:
        try:
            process = subprocess.Popen(launch.command(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       cwd=folder.files, pass_fds=launch.fds, stdin=subprocess.DEVNULL, env=launch.env)
        except OSError as error:
            raise LinkRunError(f"the sandbox did not start: {error}",
                               f"run {typed('doctor')}; see {TROUBLESHOOTING}") from None
    return Probe(process, folder, seccomp is not None)

"""Which entries of a repository's config the git check keeps (gitcheck.py):
the rule, and git's own parser and editor to apply it.

The rule is an allow list of keys that never make git run a program: what
`git init`, `clone`, `remote add`, `worktree add` and `submodule` write, and
settings an agent may want. Any other key a program adds (core.fsmonitor,
core.hooksPath, core.sshCommand, core.pager, core.editor, alias.*, filter.*,
diff.*, merge.*, credential.*, gpg.*, include.*, includeIf.*, url.*, the
protocol and transport keys, and keys git adds later) is taken out: a key
we have not seen is treated as one that runs something. Two allowed keys
are checked by value: a remote's URL must be a network URL (`::` names a
transport helper, `ext::` a command; a local path could name a bare
repository whose hooks a push runs), and a submodule's `update` must not
start with `!` (a command).

The config is parsed and edited by the host's git itself (`git config
--file`), which reads nothing else of the repository and runs nothing: our
reading of a file is then git's reading of it.
"""

from __future__ import annotations

import re
import shutil
import subprocess

# section.key, or section.*.key for any subsection; lowercase, as git lists them.
ALLOWED = frozenset("""
core.repositoryformatversion core.filemode core.bare core.logallrefupdates core.ignorecase
core.precomposeunicode core.symlinks core.autocrlf core.eol core.safecrlf core.worktree core.sparsecheckout
core.sparsecheckoutcone core.splitindex core.untrackedcache core.checkstat core.trustctime core.compression
core.abbrev core.quotepath core.preloadindex core.commentchar core.bigfilethreshold core.multipackindex
core.commitgraph
extensions.objectformat extensions.worktreeconfig extensions.refstorage extensions.partialclone
extensions.preciousobjects extensions.noop
remote.*.url remote.*.pushurl remote.*.fetch remote.*.push remote.*.mirror remote.*.tagopt remote.*.prune
remote.*.prunetags remote.*.promisor remote.*.partialclonefilter remote.*.skipdefaultupdate
remote.*.skipfetchall
branch.*.remote branch.*.merge branch.*.rebase branch.*.pushremote branch.*.description
submodule.active submodule.*.url submodule.*.active submodule.*.branch submodule.*.update
submodule.*.fetchrecursesubmodules submodule.*.ignore submodule.*.shallow
user.name user.email init.defaultbranch pull.rebase pull.ff push.default push.autosetupremote fetch.prune
fetch.recursesubmodules lfs.repositoryformatversion gc.auto receive.denycurrentbranch index.version
clone.defaultremotename
""".split())  # noqa: SIM905 (a list, read as one)
# A network URL: a scheme git speaks itself, or scp's user@host:path.
_NETWORK_URL = re.compile(r"^(https?|ssh|git|git\+ssh|ssh\+git)://[^/-]|^[A-Za-z0-9._~-]+@[A-Za-z0-9.-]+:")

Entry = tuple[str, str | None]  # (key as git lists it, value; None for a key without one)


class Unreadable(Exception):
    """git cannot parse the file (or there is no git): it is set aside whole."""


def allowed(entry: Entry) -> bool:
    key, value = entry
    section, _, rest = key.partition(".")
    subsection, _, name = rest.rpartition(".")
    pattern = f"{section}.*.{name}" if subsection else f"{section}.{name}"
    if pattern not in ALLOWED:
        return False
    if pattern in ("remote.*.url", "remote.*.pushurl"):
        return value is not None and "::" not in value and bool(_NETWORK_URL.match(value))
    if pattern == "submodule.*.update":
        return value is not None and not value.lstrip().startswith("!")
    return True


def _git() -> str:
    found = shutil.which("git", path="/usr/local/bin:/usr/bin:/bin")
    if found is None:
        raise Unreadable("no git on this machine")
    return found


# git reads only the file it is given: no system or global config, no
# repository of its working folder (`/`), no includes (off with --file).
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
        "HOME": "/nonexistent", "GIT_CEILING_DIRECTORIES": "/", "LC_ALL": "C"}


def entries(text: bytes) -> list[Entry]:
    """The file's entries, as git reads them; Unreadable when git cannot."""
    if not text.strip():
        return []
    done = subprocess.run([_git(), "config", "--file", "-", "--no-includes", "--list", "--null"], input=text, cwd="/",
                          env=_ENV, capture_output=True, timeout=30)
    if done.returncode != 0:
        raise Unreadable(_first_line(done.stderr))
    found: list[Entry] = []
    for item in done.stdout.split(b"\0")[:-1]:
        key, newline, value = item.decode(errors="surrogateescape").partition("\n")
        found.append((key, value if newline else None))
    return found


def remove(dir_fd: int, name: str, bad: list[Entry]) -> None:
    """Take `bad` out of the file `name` in the folder `dir_fd`, in place, by
    git (which keeps the rest as it was, and writes through `<name>.lock`, so
    a git of the user's writing at once fails rather than being lost).
    Unreadable when git could not."""
    path = f"/proc/self/fd/{dir_fd}/{name}"  # the folder checked, whatever its path holds now
    for key, value in dict.fromkeys(bad):
        argv = [_git(), "config", "--file", path]
        if value is None:
            argv += ["--unset-all", key]
        elif _git_has_fixed_value():
            argv += ["--fixed-value", "--unset-all", key, value]
        else:
            argv += ["--unset-all", key, f"^{re.escape(value)}$"]
        done = subprocess.run(argv, cwd="/", env=_ENV, capture_output=True, timeout=30, pass_fds=(dir_fd,))
        if done.returncode not in (0, 5):  # 5: gone already
            raise Unreadable(_first_line(done.stderr))


_FIXED_VALUE: list[bool] = []


def _git_has_fixed_value() -> bool:
    """--fixed-value came with git 2.30; before, a value is matched by an escaped pattern."""
    if not _FIXED_VALUE:
        done = subprocess.run([_git(), "version"], capture_output=True, text=True, env=_ENV, cwd="/", timeout=30)
        numbers = re.findall(r"\d+", done.stdout)[:2]
        _FIXED_VALUE.append(len(numbers) == 2 and (int(numbers[0]), int(numbers[1])) >= (2, 30))
    return _FIXED_VALUE[0]


def _first_line(text: bytes) -> str:
    return (text.decode(errors="replace").strip().splitlines() or ["git failed"])[0]

"""The git check (DESIGN.md §6; docs/decisions.md "The git check"): what a
program wrote into a repository that the user's own git would obey is set
aside when its call or background command ends, before the call is
answered or the command's end is recorded.

1. Before the program runs, `look` finds the repositories within three
   levels of the write folders (as the old guard did, but with no cap) and
   notes what git obeys in each by identity: its `config` and
   `config.worktree` (with their text), `commondir`, `hooks` and each hook
   not named `*.sample`, a `.git` file or link, and the same in the git
   folders of its linked worktrees and submodules, and in the git folder a
   `.git` file names when that lies in a write folder.
2. The program runs, with the write folders writable, nothing bound over
   them: it may change or remove any repository.
3. After every process of it ended, `GitLook.check` looks again. What is new
   or changed (by identity, or, for what changed within `RACY` of the first
   look, by content) is checked: a new or changed hook, `commondir`, `.git`
   link, a `hooks` that is no folder, a `.git` file that names a folder out
   of the write folders is renamed aside (`<name>.lnk-set-aside-<hex>`,
   where git never looks); a config's entries that the program added and
   that could run a program (gitconfig.py) are taken out, the rest kept.

Every folder is opened one component at a time without following a link,
so a program racing the check (a background command still running) cannot
make it rename or edit anything outside the files folder.
"""

from __future__ import annotations

import os
import secrets
import stat
import time
from collections.abc import Callable, Sequence
from typing import Any
from dataclasses import dataclass, field

from . import gitconfig
from .beneath import FLAGS, MISSING, NotBeneath, open_folder
from .gitfind import lstat as _lstat, repositories as _repositories

RACY = 100_000_000  # ns: a file changed this close before the look is compared by content (coarse clocks)
READ_LIMIT = 1 << 20  # a config or racy hook longer than this is checked as changed
MODULE_DEPTH = 4  # submodules within submodules, followed this deep
SET_ASIDE = ".lnk-set-aside-"  # what a check renamed: `<name>.lnk-set-aside-<hex>`

# kind of each noted path: what to do with it when it is new or changed
CONFIG, HOOK, HOOKS, POINTER, ASIDE, COMMONDIR = "config", "hook", "hooks", "pointer", "aside", "commondir"


@dataclass
class Noted:
    kind: str
    ident: tuple[int, ...]
    text: bytes | None = None  # a config's, or a racy file's


@dataclass
class GitLook:
    """What git obeys in the repositories of the write folders, at one time."""

    files_path: str
    write: tuple[str, ...]
    taken: int = field(default_factory=time.time_ns)
    noted: dict[str, Noted] = field(default_factory=dict)  # path relative to the files folder -> what it was
    clean: dict[str, tuple[int, ...]] = field(default_factory=dict)  # path -> identity a check of this run found clean

    def check(self, files_fd: int) -> list[str]:
        """Step 3: look again, and set aside what changed; what was done, one line each."""
        now = look(files_fd, self.files_path, self.write)
        done: list[str] = []
        for path, after in now.noted.items():
            before = self.noted.get(path)
            if before is not None and before.ident == after.ident and before.ident[-1] < self.taken - RACY:
                continue
            if self.clean.get(path) == after.ident:
                continue  # found clean by an earlier check of this run, and not changed since
            try:
                if before is not None and before.text is not None and before.ident[0] == after.ident[0] \
                        and _read_at(files_fd, path) == before.text:
                    continue
                did = _neutralise(files_fd, self, path, after, before)
                if not did and after.ident[-1] < time.time_ns() - RACY:
                    self.clean[path] = after.ident
                done += did
            except OSError as error:  # gone meanwhile: nothing left to obey; any other failure is said
                if not isinstance(error, FileNotFoundError):
                    done.append(f"{path}: could not be checked ({error.strerror})")
            except NotBeneath as refused:  # its folder: the same
                if refused.why != MISSING:
                    done.append(f"{path}: could not be checked (its folder {refused.part!r} {refused.why})")
        return done


class Meanwhile:
    """A watch's tick: `then` (another tick, if any), and step 3 while the
    program runs, every EVERY seconds, or 50 times what the last check took
    if longer (under 2% of the time, however many repositories). What it
    does goes to `log`, or else to `notes`. Returns how soon it is due."""

    EVERY = 2.0

    def __init__(self, first: GitLook, notes: list[str], then: Callable[[Any], float | None] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.first, self.notes, self.then, self.log = first, notes, then, log
        self.due = time.monotonic() + self.EVERY

    def __call__(self, watch: object) -> float:
        now = time.monotonic()
        if now >= self.due:
            done = after(self.first)
            if self.log is None:
                self.notes += done
            else:
                for note in done:
                    self.log(note)
            self.due = time.monotonic() + max(self.EVERY, 50 * (time.monotonic() - now))
        soon = max(0.0, self.due - time.monotonic())
        other = self.then(watch) if self.then is not None else None
        return soon if other is None else min(soon, other)


def after(first: GitLook) -> list[str]:
    """Step 3 on the files folder opened afresh: what it did, or why it could not, one line each."""
    try:
        files_fd = os.open(first.files_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return first.check(files_fd)
        finally:
            os.close(files_fd)
    except Exception as error:  # noqa: BLE001 (said, never raised: the run is over and must be answered)
        return [f"the git check could not run ({type(error).__name__}: {error}): look at the repositories "
                f"in {first.files_path} before you run git there"]


def look(files_fd: int, files_path: str, write: Sequence[str]) -> GitLook:
    """Step 1, and step 3's second look (a config's text is read again only when it changed)."""
    result = GitLook(files_path, tuple(write))
    seen_git: set[str] = set()
    for rel in sorted(set(write)):
        try:
            write_fd = open_folder(files_fd, rel)
        except (OSError, NotBeneath):
            continue  # missing, or not a folder: percall refuses or makes it
        try:
            for path, kind, at in _repositories(write_fd, rel):
                _note_repository(files_fd, at, path, kind, result, seen_git, write)
        finally:
            os.close(write_fd)
    return result


# Noting what git obeys in each.

def _note_repository(files_fd: int, at: tuple[int, str], path: str, kind: str, result: GitLook, seen_git: set[str],
                     write: Sequence[str]) -> None:
    """`at`: the folder the scan holds open, and the name below it (the scan
    opened every folder above from the files folder, following no link)."""
    if kind in ("link", "pointer"):
        folder, _, name = at[1].rpartition("/")
        try:  # `b/.git`: `b` opened on its own, following no link
            folder_fd = open_folder(at[0], folder) if folder else at[0]
        except (OSError, NotBeneath):
            return
        try:
            _note_at(folder_fd, name, path, ASIDE if kind == "link" else POINTER, result)
        finally:
            if folder_fd != at[0]:
                os.close(folder_fd)
    if kind == "pointer":
        target = _pointed(files_fd, result.files_path, path, write)
        if target is not None:
            _note_git_folder(files_fd, target, result, seen_git, MODULE_DEPTH)
    elif kind != "link":
        _note_git_folder(files_fd, path, result, seen_git, MODULE_DEPTH, at)


def _note_git_folder(files_fd: int, path: str, result: GitLook, seen_git: set[str], depth: int,
                     at: tuple[int, str] | None = None) -> None:
    if path in seen_git:
        return
    seen_git.add(path)
    try:
        git_fd = open_folder(files_fd if at is None else at[0], path if at is None else at[1])
    except (OSError, NotBeneath):
        return
    try:
        for name, kind in (("config", CONFIG), ("config.worktree", CONFIG), ("commondir", COMMONDIR)):
            _note_at(git_fd, name, f"{path}/{name}", kind, result)
        hooks = _note_at(git_fd, "hooks", f"{path}/hooks", HOOKS, result)
        if hooks is not None and stat.S_ISDIR(hooks.st_mode):
            _note_hooks(git_fd, "hooks", f"{path}/hooks", result)
        # The user's own core.hooksPath (husky's `.husky/_`), when it names a folder of a write folder.
        hooks_path = _hooks_path(result.noted.get(f"{path}/config"))
        root = path.rpartition("/")[0] if path.endswith("/.git") else path  # where git runs hooks
        where = _within(files_fd, result.files_path, root, hooks_path, result.write, True) if hooks_path else None
        if where is not None:
            _note_hook_folder(files_fd, where, result)
        for linked in _subfolders(git_fd, "worktrees"):
            for name, kind in (("config.worktree", CONFIG), ("commondir", COMMONDIR)):
                _note_at(git_fd, f"worktrees/{linked}/{name}", f"{path}/worktrees/{linked}/{name}", kind, result)
        if depth > 0:
            for module in _git_folders_below(git_fd, "modules", MODULE_DEPTH):
                _note_git_folder(files_fd, f"{path}/{module}", result, seen_git, depth - 1)
    finally:
        os.close(git_fd)


def _note_hook_folder(files_fd: int, rel: str, result: GitLook) -> None:
    parent, _, name = rel.rpartition("/")
    try:
        parent_fd = open_folder(files_fd, parent)
    except (OSError, NotBeneath):
        return
    try:
        folder = _note_at(parent_fd, name, rel, HOOKS, result)
        if folder is not None and stat.S_ISDIR(folder.st_mode):
            _note_hooks(parent_fd, name, rel, result)
    finally:
        os.close(parent_fd)


def _note_hooks(dir_fd: int, name: str, path: str, result: GitLook) -> None:
    try:
        hooks_fd = os.open(name, FLAGS, dir_fd=dir_fd)
    except OSError:
        return
    try:
        with os.scandir(hooks_fd) as entries:
            for entry in entries:
                # git runs hooks by their exact names: never a sample, nor what a check set aside
                if not entry.name.endswith(".sample") and SET_ASIDE not in entry.name:
                    _note_at(hooks_fd, entry.name, f"{path}/{entry.name}", HOOK, result)
    finally:
        os.close(hooks_fd)


def _note_at(dir_fd: int, name: str, path: str, kind: str, result: GitLook) -> os.stat_result | None:
    info = _lstat(dir_fd, name)
    if info is None:
        return None
    ident = (info.st_mode, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    text = None
    if stat.S_ISREG(info.st_mode) and (kind == CONFIG or info.st_ctime_ns >= result.taken - RACY):
        text = _TEXTS.get((path, ident)) if info.st_ctime_ns < result.taken - RACY else None
        if text is None:
            text = _read(dir_fd, name)
            if text is not None and info.st_ctime_ns < result.taken - RACY:
                if len(_TEXTS) >= TEXTS_KEPT:
                    _TEXTS.clear()
                _TEXTS[(path, ident)] = text
    result.noted[path] = Noted(kind, ident, text)
    return info


# A config's text by its path and identity, from an earlier look of this
# process (serve looks at every call): one not changed since is not read again.
_TEXTS: dict[tuple[str, tuple[int, ...]], bytes] = {}
TEXTS_KEPT = 20_000


def _subfolders(dir_fd: int, name: str) -> list[str]:
    try:
        sub_fd = os.open(name, FLAGS, dir_fd=dir_fd)
    except OSError:
        return []
    try:
        with os.scandir(sub_fd) as entries:
            return [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
    finally:
        os.close(sub_fd)


def _git_folders_below(dir_fd: int, name: str, depth: int) -> list[str]:
    """Folders below `name` holding a HEAD (a submodule's git folder, whose
    name may hold slashes), to `depth` levels; not below one found."""
    found: list[str] = []
    for sub in _subfolders(dir_fd, name):
        path = f"{name}/{sub}"
        if _lstat(dir_fd, f"{path}/HEAD") is not None:
            found.append(path)
        elif depth > 1:
            found += _git_folders_below(dir_fd, path, depth - 1)
    return found


def _pointed(files_fd: int, files_path: str, path: str, write: Sequence[str]) -> str | None:
    """Where a `.git` file points, relative to the files folder, when that is
    a folder in a write folder reached through no link (as git would reach
    it); None when it points elsewhere, or says nothing git reads."""
    text = _read_at(files_fd, path) or b""
    line = text.decode(errors="replace").split("\n", 1)[0]
    if not line.startswith("gitdir:"):
        return None
    return _within(files_fd, files_path, path.rpartition("/")[0], line[len("gitdir:"):].strip(), write)


def _within(files_fd: int, files_path: str, base: str, target: str, write: Sequence[str],
            last_any: bool = False) -> str | None:
    """`target` (absolute, or relative to the folder `base`), relative to the
    files folder, when it is a folder in a write folder reached through no
    link (with `last_any`, its last name may be anything, or nothing yet);
    else None."""
    if target.startswith("/"):
        if not target.startswith(files_path.rstrip("/") + "/"):
            return None
        names = target[len(files_path.rstrip("/")) + 1:].split("/")
    else:
        names = base.split("/") + target.split("/")
    # Walked as git's open would, but refusing a link: then `..` is the parent named.
    kept: list[str] = []
    names = [name for name in names if name not in ("", ".")]
    for at, name in enumerate(names):
        if last_any and at == len(names) - 1 and name != "..":
            kept.append(name)
            break
        if name == "..":
            if not kept:
                return None
            kept.pop()
        else:
            kept.append(name)
            try:  # a folder, reached through no link
                os.close(open_folder(files_fd, "/".join(kept)))
            except (OSError, NotBeneath):
                return None
    rel = "/".join(kept)
    return rel if any(rel.startswith(w + "/") for w in write) else None


def _hooks_path(config: Noted | None) -> str | None:
    """core.hooksPath of a config the check kept (the user's own: a program's
    is taken out), as git reads it; None without one."""
    if config is None or config.text is None or b"hookspath" not in config.text.lower():
        return None
    if config.text not in _HOOKS_PATHS:
        try:
            found = [value for key, value in gitconfig.entries(config.text) if key == "core.hookspath"]
        except gitconfig.Unreadable:
            found = []
        _HOOKS_PATHS[config.text] = found[-1] if found and found[-1] else None
    return _HOOKS_PATHS[config.text]


_HOOKS_PATHS: dict[bytes, str | None] = {}  # a config's text -> its hooksPath, parsed once by git


def _read_at(files_fd: int, path: str) -> bytes | None:
    parent, _, name = path.rpartition("/")
    try:
        parent_fd = open_folder(files_fd, parent)
    except (OSError, NotBeneath):
        return None
    try:
        return _read(parent_fd, name)
    finally:
        os.close(parent_fd)


def _read(dir_fd: int, name: str) -> bytes | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        size = 0
        while size <= READ_LIMIT:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
        return None
    finally:
        os.close(fd)


# Step 3: setting aside.

def _neutralise(files_fd: int, first: GitLook, path: str, after: Noted, before: Noted | None) -> list[str]:
    parent, _, name = path.rpartition("/")
    parent_fd = open_folder(files_fd, parent)
    try:
        kind, mode = after.kind, after.ident[0]
        if kind == CONFIG:
            return _check_config(parent_fd, name, path, before)
        if kind == HOOKS and stat.S_ISDIR(mode):
            return []
        if kind == POINTER and stat.S_ISREG(mode) and _pointed(files_fd, first.files_path, path,
                                                               first.write) is not None:
            return []
        if kind == COMMONDIR and "/worktrees/" in path and _points_home(parent_fd, name):
            return []
        return [_set_aside(parent_fd, name, path)]
    finally:
        os.close(parent_fd)


def _points_home(worktree_fd: int, name: str) -> bool:
    """A linked worktree's commondir names the git folder it lies in (`../..`)."""
    text = _read(worktree_fd, name)
    return text is not None and text.strip() in (b"../..", b"../../")


def _set_aside(parent_fd: int, name: str, path: str) -> str:
    aside = f"{name}{SET_ASIDE}{secrets.token_hex(4)}"
    os.rename(name, aside, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    return f"{path}: set aside as {aside} (git would have obeyed it)"


def _check_config(dir_fd: int, name: str, path: str, before: Noted | None) -> list[str]:
    info = _lstat(dir_fd, name)
    if info is None:
        return []
    if not stat.S_ISREG(info.st_mode):
        return [_set_aside(dir_fd, name, path)]
    text = _read(dir_fd, name)
    try:
        if text is None:
            raise gitconfig.Unreadable("too long")
        kept = set(gitconfig.entries(before.text)) if before is not None and before.text else set()
        bad = [entry for entry in gitconfig.entries(text) if not gitconfig.allowed(entry) and entry not in kept]
        if not bad:
            return []
        gitconfig.remove(dir_fd, name, bad)
    except gitconfig.Unreadable as problem:
        return [_set_aside(dir_fd, name, path) + f": {problem}"]
    return [f"{path}: {', '.join(sorted({key for key, _ in bad}))} taken out (git would have run what they name)"]
